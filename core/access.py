"""The engine-order access sequence of a trace, the one future the oracle family reads.

One key (layer * num_experts + expert id) per access: iterations in the static schedule's
order (core/schedule.py), MoE layers ascending, then the ascending ids of the union of the
iteration's tokens at that layer (the engine's access set, docs/metrics.md). Blocks are the
non-empty (iteration, layer) steps in that order. It is the engine's sequence only when the
schedule does not depend on timing (`schedule_is_timing_independent`): max_batch = 1 or
every request arriving at once; `access_sequence` raises otherwise.

Shared by systems/oracle/ (the oracle, belady*), systems/evictors/belady.py and
analysis/gap.py, so the plan, the evictor and the counterfactual replays see one sequence.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from core.blocks import BlockIndex
from core.schedule import schedule_is_timing_independent, static_schedule

NEVER = 1 << 62  # the next use of a key that is not used again


class AccessSequence:
    """keys_array, next_use_array int64 [n] (next use: the next position of the same key,
    NEVER if none; one stable sort of the keys); block_starts_array int64 [B + 1] (first
    position of each block, then n); block_iteration, block_layer int64 arrays [B];
    iteration_kinds [I]; iteration_starts [I + 1] (first position of iteration i, then n).

    `keys`, `next_use`, `block_starts` are the same as python lists, built on first use: the
    oracle's plan reads the arrays, the per-step readers (evictors, replays) the lists."""

    def __init__(self, keys: np.ndarray, block_starts: np.ndarray, block_iteration: np.ndarray,
                 block_layer: np.ndarray, iteration_kinds: list[str]):
        self.keys_array = np.asarray(keys, dtype=np.int64)
        n = len(self.keys_array)
        self.iteration_kinds = iteration_kinds  # "prefill" or "decode" per iteration
        self.block_starts_array = np.append(np.asarray(block_starts, np.int64), n)
        self.block_iteration = np.asarray(block_iteration, np.int64)
        self.block_layer = np.asarray(block_layer, np.int64)
        # An iteration without a block starts where the next one does.
        first_block = np.searchsorted(self.block_iteration, np.arange(len(iteration_kinds) + 1))
        self.iteration_starts = self.block_starts_array[first_block].tolist()
        # Positions grouped by key, ascending within a key [n]: the next use of the position
        # order[i] is order[i + 1] when both hold the same key.
        small = n and 0 <= self.keys_array.min() and self.keys_array.max() < 1 << 16
        # uint16 keys: numpy's stable sort is a radix sort, linear in n
        self._order = np.argsort(self.keys_array.astype(np.uint16) if small else self.keys_array,
                                 kind="stable")
        grouped = self.keys_array[self._order]
        nxt = np.full(n, NEVER, dtype=np.int64)
        same = grouped[1:] == grouped[:-1]
        nxt[self._order[:-1][same]] = self._order[1:][same]
        self.next_use_array = nxt
        self._grouped = grouped
        self._lists: dict[str, list[int]] = {}
        self._block_at: dict[tuple[int, int], int] | None = None
        self._positions: dict[int, list[int]] | None = None

    def _list(self, name: str) -> list[int]:
        if name not in self._lists:
            self._lists[name] = getattr(self, name + "_array").tolist()
        return self._lists[name]

    @property
    def keys(self) -> list[int]:
        return self._list("keys")

    @property
    def next_use(self) -> list[int]:
        return self._list("next_use")

    @property
    def block_starts(self) -> list[int]:
        return self._list("block_starts")

    @property
    def num_blocks(self) -> int:
        return len(self.block_iteration)

    def block_at(self, iteration: int, layer: int) -> int | None:
        """The block of (iteration, layer), None when that step routed to no expert."""
        if self._block_at is None:  # built on first use: only the per-step readers ask
            self._block_at = {(i, layer): b for b, (i, layer) in enumerate(
                zip(self.block_iteration.tolist(), self.block_layer.tolist()))}
        return self._block_at.get((iteration, layer))

    def block_keys(self, b: int) -> list[int]:
        starts = self.block_starts
        return self.keys[starts[b]:starts[b + 1]]

    def next_at(self, key: int, pos: int) -> int:
        """The first position >= pos that accesses `key`, NEVER if none."""
        if self._positions is None:  # built on first use: only some readers ask
            cuts = np.flatnonzero(np.diff(self._grouped)) + 1
            groups = np.split(self._order, cuts)
            firsts = self._grouped[np.concatenate(([0], cuts))] if len(self._grouped) else []
            self._positions = {int(k): g.tolist() for k, g in zip(firsts, groups)}
        occ = self._positions.get(key)
        if not occ:
            return NEVER
        i = bisect_left(occ, pos)
        return occ[i] if i < len(occ) else NEVER

    def restricted(self, mask: np.ndarray) -> AccessSequence:
        """The accesses where `mask` (bool [n]) holds, every block kept, some perhaps empty:
        one GPU's share of the sequence when several run it (docs/gpus.md)."""
        kept_before = np.concatenate(([0], np.cumsum(mask)))  # [n + 1]
        return AccessSequence(self.keys_array[mask], kept_before[self.block_starts_array[:-1]],
                              self.block_iteration, self.block_layer, self.iteration_kinds)

    def position_iterations(self) -> np.ndarray:
        """The iteration of each position, int64 [n]."""
        return np.repeat(self.block_iteration, np.diff(self.block_starts_array))

    def blocks(self):
        """(block, iteration, layer, keys) in order."""
        iterations, layers = self.block_iteration.tolist(), self.block_layer.tolist()
        for b in range(self.num_blocks):
            yield b, iterations[b], layers[b], self.block_keys(b)


def access_sequence(trace, max_batch: int, keep=None) -> AccessSequence:
    """The trace's access sequence at `max_batch` (ValueError when timing changes the
    schedule, so no offline sequence is the engine's). `keep(keys, iterations) -> bool mask`
    (SystemContext.gpu_accesses): only the accesses one of several GPUs runs."""
    seq = _full_sequence(trace, max_batch)
    return seq if keep is None else seq.restricted(keep(seq.keys_array,
                                                        seq.position_iterations()))


def _full_sequence(trace, max_batch: int) -> AccessSequence:
    if not schedule_is_timing_independent(trace.arrival_ms, max_batch):
        raise ValueError("the oracle family needs a schedule that does not depend on timing: "
                         "max_batch = 1 or every request arriving at the same time")
    index = BlockIndex.of(trace)
    schedule = static_schedule(trace.arrival_ms, trace.output_len, max_batch)
    L, E = index.L, trace.num_experts
    # Every (iteration, member) pair in schedule order: its iteration and its global step.
    pair_it = np.array([i for i, (_, members) in enumerate(schedule) for _ in members],
                       dtype=np.int64)
    pair_step = np.array([index.step_off[r] + s for _, members in schedule for r, s in members],
                         dtype=np.int64)
    blk = (pair_step[:, None] * L + np.arange(L)).ravel()  # [P * L] member blocks
    lo, hi = index.bounds_array[blk], index.bounds_array[blk + 1]
    lens = hi - lo
    ends = np.cumsum(lens)
    rows = np.repeat(lo - (ends - lens), lens) + np.arange(ends[-1] if len(ends) else 0)
    # The engine's step: the union of the members' ids at (iteration, layer), ascending.
    step = np.repeat((pair_it[:, None] * L + np.arange(L)).ravel(), lens)  # iteration * L + layer
    code = step * E + index.ids_array[rows]
    if any(len(members) > 1 for _, members in schedule):
        # Sorted: iterations, then layers, then ids; duplicates merged. The codes are one
        # ascending run per member, so the stable sort (timsort) merges runs.
        code = np.sort(code, kind="stable")
        code = code[np.r_[True, code[1:] != code[:-1]]]
    step = code // E
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]]) if len(step) else step
    return AccessSequence(code % (L * E), first, step[first] // L, step[first] % L,
                          [kind for kind, _ in schedule])
