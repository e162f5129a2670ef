"""Node labels for schedulers, computed from the same records the metrics come from."""
