"""none: never prefetch; every miss is a demand fetch. propose() answers None (the queue is
left as it is, and it is always empty)."""

from __future__ import annotations

from systems.prefetchers.base import Prefetcher


class NoPrefetch(Prefetcher):
    name = "none"
