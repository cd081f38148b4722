"""belady: Belady's MIN victim, the resident whose next use is farthest (a bound: it reads the
future through ctx.trace, the shared access sequence of core/access.py).

Next use is a position in that sequence. For a load of `incoming` at position p (its place in
the current step; a key outside the step: the step's end), a key of the current step not yet
reached at p is needed at its own position; any other resident at its next access after the
step. Order: farthest first; ties (keys never used again) by the lowest key. For a demand
fetch whose farthest resident is a key of the current step already reached but not yet run
(pinned), the answer is None: the engine waits until it has run and asks again. So with
demand fetches only the loads are MIN's over the sequence (tests/systems/test_oracle_family.py);
non-evictable residents otherwise (in flight) are skipped.

`lookahead_iterations` k: only uses up to the end of iteration i + k (i: the current step's)
are known; later uses count as never, so such residents tie and go lowest key first.
Needs a timing-independent schedule (max_batch = 1 or every request arriving at once).
"""

from __future__ import annotations

import heapq

from core.access import NEVER, access_sequence
from core.knobs import int_knob
from systems.evictors.base import Evictor


def _walk(heap: list):
    """Entries of a heap in ascending order without popping it (a pure read)."""
    if not heap:
        return
    frontier = [(heap[0], 0)]
    while frontier:
        item, i = heapq.heappop(frontier)
        yield item
        for c in (2 * i + 1, 2 * i + 2):
            if c < len(heap):
                heapq.heappush(frontier, (heap[c], c))


class BeladyEvictor(Evictor):
    name = "belady"
    bound = True

    def __init__(self, lookahead_iterations: int | None = None):
        self.lookahead_iterations = int_knob(lookahead_iterations, "lookahead_iterations", lo=1,
                                             null="the whole trace")

    def bind(self, ctx):
        super().bind(ctx)
        if ctx.trace is None:
            raise ValueError("belady reads the future: its system must be flagged oracle")
        self.seq = access_sequence(ctx.trace, ctx.max_batch, ctx.gpu_accesses)
        self.end = 0  # first position after the current step
        self.step_pos: dict[int, int] = {}  # key of the current step -> its position
        self.window_end = NEVER + 1  # uses at or after it count as never
        self.nu: dict[int, int] = {}  # resident key -> next use at or after self.end
        self.heap: list[tuple[int, int]] = []  # (-next use, key), lazily invalidated
        self.far: list[int] = []  # lookahead: keys past the window, lazily invalidated

    def _push(self, key: int) -> None:
        nu = self.nu[key]
        heapq.heappush(self.heap, (-nu, key))
        if nu >= self.window_end:
            heapq.heappush(self.far, key)

    def on_access(self, iteration, layer, keys, now_ms):
        seq = self.seq
        b = seq.block_at(iteration.index, layer)
        if b is None or seq.block_keys(b) != keys:
            raise ValueError(f"belady: step (iteration {iteration.index}, layer {layer}) is not "
                             "the planned access sequence's (timing changed the schedule?)")
        start, self.end = seq.block_starts[b], seq.block_starts[b + 1]
        self.step_pos = {k: start + j for j, k in enumerate(keys)}
        if self.lookahead_iterations is not None:
            it = min(seq.block_iteration[b] + self.lookahead_iterations + 1,
                     len(seq.iteration_starts) - 1)
            self.window_end = seq.iteration_starts[it]
        for j, key in enumerate(keys):
            if key in self.nu:
                self.nu[key] = seq.next_use[start + j]
                self._push(key)
        self._clean()

    def _clean(self) -> None:
        """Drop stale heap entries: at the top (an evicted victim's, usually), and all of them
        once they outnumber the residents (amortised)."""
        nu, heap, far, we = self.nu, self.heap, self.far, self.window_end
        while heap and nu.get(heap[0][1]) != -heap[0][0]:
            heapq.heappop(heap)
        while far and nu.get(far[0], -1) < we:
            heapq.heappop(far)
        if len(heap) > 2 * len(nu) + 64:
            self.heap = [(-v, k) for k, v in nu.items()]
            heapq.heapify(self.heap)
        if len(far) > 2 * len(nu) + 64:
            self.far = [k for k, v in nu.items() if v >= we]
            heapq.heapify(self.far)

    def on_insert(self, key, demand, now_ms):
        self.nu[key] = self.seq.next_at(key, self.end)
        self._push(key)

    def on_evict(self, key, now_ms):
        self.nu.pop(key, None)
        self._clean()

    def next_use(self, key: int) -> int:
        """The next use of `key` after the current step (NEVER: none, or past the window)."""
        nu = self.seq.next_at(key, self.end)
        return nu if nu < self.window_end else NEVER

    def order(self, incoming: int):
        """(key, next use) of every resident, the preferred victim first (see the module)."""
        p = self.step_pos.get(incoming, self.end)
        step_pos, nu, we = self.step_pos, self.nu, self.window_end
        later = []  # keys of the step not yet reached at p: needed at their own position
        for key in _walk(self.far):  # past the window: all "never", lowest key first
            if nu.get(key, -1) >= we and step_pos.get(key, -1) < p:
                yield key, NEVER
        for neg, key in _walk(self.heap):
            if nu.get(key) != -neg:
                continue
            if step_pos.get(key, -1) >= p:
                later.append(key)
            elif -neg < we:
                yield key, -neg
        for key in sorted(set(later), key=lambda k: -step_pos[k]):
            yield key, step_pos[key]

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        p = self.step_pos.get(incoming, self.end)
        for key, _ in self.order(incoming):
            if key in candidates:
                return key
            if demand and self.step_pos.get(key, p) < p:
                return None  # pinned until it runs: wait for it (MIN's victim)
        return None

    def describe(self):
        return {"name": self.name, "lookahead_iterations": self.lookahead_iterations}
