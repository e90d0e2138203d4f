"""Worker processes: claim tasks with leases, run tools, write outcomes, reap and keep house."""
