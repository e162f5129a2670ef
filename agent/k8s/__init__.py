"""Kubernetes: which pod and container a process, a cgroup or a BPF event belongs to."""
