"""Attribution: the stage between sources and exporters that says whose everything is.

Sources read devices, processes, cgroups and the kubelet's allocations without knowing about
each other; this stage joins them (GPU -> allocation -> pod -> workload, GPU process -> cgroup
-> pod, network cgroup -> pod) and keeps the only state that needs the join: how long each
allocated GPU has sat idle, and the idle GPU-seconds per workload.
"""
