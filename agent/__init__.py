"""gpuscope: node-level GPU and network observability agent for Kubernetes."""

__version__ = "0.1.0"
