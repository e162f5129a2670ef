"""Network sources: what the node's NICs and RDMA devices say about themselves in sysfs."""
