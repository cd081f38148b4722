"""Prefetch policies (the zoo): one file each, every one a Prefetcher (base.py)."""
