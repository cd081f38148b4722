"""Eviction policies (the zoo): one file each, every one an Evictor (base.py)."""
