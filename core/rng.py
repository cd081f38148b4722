"""All randomness comes from named streams of one root seed (never the global np.random)."""

from __future__ import annotations

import hashlib

import numpy as np


def stream(root_seed: int, name: str) -> np.random.Generator:
    """An independent generator for `name`; the same (seed, name) always gives the same stream."""
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng(np.random.SeedSequence([int(root_seed), key]))
