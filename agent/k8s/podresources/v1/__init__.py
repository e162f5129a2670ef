"""The kubelet's PodResources v1 API: the vendored proto and the stubs generated from it.

Everything here except api.proto is output of scripts/gen-podresources.sh; edit nothing by hand.
"""
