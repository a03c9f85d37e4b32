"""A job's processes on this machine: its supervisor, process bookkeeping, whole-tree
cleanup, and the idle-GPU rule it applies."""
