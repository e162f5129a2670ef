"""The accelerator contract: one record for any vendor's GPUs (records.py)."""
