"""Network sources: the node's NICs and RDMA ports (sysfs) and its pods' traffic (eBPF)."""
