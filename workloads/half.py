"""float32 -> float16 by integer operations: numpy's cast is a scalar loop (about 5 ns a
value on the reference machine), this is about ten vectorised passes.

IEEE 754 conversion rounds to nearest, ties to even, so any correct implementation gives
numpy's bits; tests/workloads/test_synthetic.py compares the two over every float32 in [0, 1] and
around float16's subnormal, normal and largest values. Values that are negative, not finite
or above float16's largest (65504) go through numpy's cast.
"""

from __future__ import annotations

import numpy as np

_F16_MAX_BITS = 0x477FE000  # float32 bits of 65504, float16's largest finite value
_F16_MIN_NORMAL_BITS = 113 << 23  # float32 bits of 2**-14, float16's smallest normal value
_REBIAS = (0xFFF - ((127 - 15) << 23)) % 2**32  # rounding bias minus the exponent offset


def to_float16(x: np.ndarray) -> np.ndarray:
    """float16 array of x (float32, any shape): round to nearest, ties to even."""
    x = np.ascontiguousarray(x, np.float32)
    u = x.view(np.uint32)  # bits; sign, inf and nan compare above _F16_MAX_BITS
    if not x.size or int(u.max()) > _F16_MAX_BITS:
        return x.astype(np.float16)
    # normal results: drop 13 mantissa bits, adding 0xFFF plus the kept lowest bit (ties to
    # even; a carry into the exponent is the right result), and move the exponent bias
    h = u >> 13
    h &= 1
    h += np.uint32(_REBIAS)
    h += u
    h >>= 13
    # subnormal results (below 2**-14): x + 0.5 rounds x to a multiple of 2**-24, float16's
    # subnormal step, in the low bits of the sum (float32 addition rounds to nearest even)
    sub = (x + np.float32(0.5)).view(np.uint32)
    sub -= np.uint32(0x3F000000)
    np.copyto(h, sub, where=u < _F16_MIN_NORMAL_BITS)
    return h.astype(np.uint16).view(np.float16)
