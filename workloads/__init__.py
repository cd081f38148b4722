"""Workloads: requests, prompts, arrivals and routing sources (synthetic by default)."""
