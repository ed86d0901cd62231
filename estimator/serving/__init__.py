"""Serving: requests under load (continuous batching, queueing) and the workload and layout options."""
