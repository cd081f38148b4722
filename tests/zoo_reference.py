"""REF: the brute-force reference simulator of tests/systems/test_evictor_zoo.py.

Semantics (REF; no code shared with the engine or the evictors):
- a cache of C slots, empty at the start; no prefetch, no preloads;
- blocks in engine order at batch 1: per request (arrival order), per step (the prefill is
  step 0), per MoE layer; a block's keys = layer * E + the union of its tokens' top-k, ascending;
- per block: first the access event for every key (a key resident at that moment is a hit,
  else a miss; hits and misses counted per access, one per key per block), then each missing
  key in ascending order is demand-loaded: the rule names a victim among the evictable
  residents, the victim leaves, the key lands;
- the keys of the current block are pinned: never victims (the resident ones are in use, the
  ones loaded in this block too);
- C >= the largest block, so a full cache always has an evictable resident: no prefill
  borrowing, no deferred demand fetch. The end of a step (a forward pass) is an event too.
Each rule is re-implemented here from its definition (the evictor's docstring) with plain
timestamps and min/max over the residents, not with the evictors' ordered structures.
Exception: belady is checked against Belady's MIN over the flat access sequence (reference_min),
where a key of the current block already accessed may be the victim: the engine's belady waits
for that expert to run rather than take a worse victim (systems/evictors/belady.py).
"""

from __future__ import annotations

from fractions import Fraction


def blocks_of(trace):
    """[(pass index, layer, ascending keys)] in engine order at batch 1, passes in order."""
    out, g = [], 0
    for r in range(trace.num_requests):
        for s in range(int(trace.output_len[r])):
            for layer in range(trace.num_layers):
                ids = sorted({int(e) for e in trace.block_rows(r, s, layer).ravel()})
                if ids:
                    out.append((g, layer, [layer * trace.num_experts + e for e in ids]))
            g += 1
    return out


class Rule:
    """REF's hooks; `t` is a global event counter shared by every rule."""

    def __init__(self, C, L, E, blocks):
        self.C, self.L, self.E, self.blocks = C, L, E, blocks
        self.t = 0  # passes end implicitly: rules compare the pass index of each event

    def tick(self) -> int:
        self.t += 1
        return self.t

    def access(self, keys, resident, pass_index, block_index): ...
    def insert(self, key, pass_index): ...
    def evicted(self, key): ...
    def victim(self, evictable, resident, incoming):
        raise NotImplementedError


class RefFIFO(Rule):
    def __init__(self, *a):
        super().__init__(*a)
        self.landed = {}

    def insert(self, key, p):
        self.landed[key] = self.tick()

    def victim(self, ev, res, incoming):
        return min(ev, key=self.landed.get) if len(res) >= self.C else None


class RefLRU(Rule):  # global: a routed key is touched in ascending order, misses included
    def __init__(self, *a):
        super().__init__(*a)
        self.used = {}

    def access(self, keys, res, p, b):
        for k in keys:
            self.used[k] = self.tick()

    def victim(self, ev, res, incoming):
        return min(ev, key=self.used.get) if len(res) >= self.C else None


class RefLRUPerLayer(Rule):  # quota min(C // L, E); a miss is touched when it lands
    def __init__(self, *a):
        super().__init__(*a)
        self.used, self.quota = {}, min(self.C // self.L, self.E)

    def access(self, keys, res, p, b):
        for k in keys:
            if k in res:
                self.used[k] = self.tick()

    def insert(self, key, p):
        self.used[key] = self.tick()

    def victim(self, ev, res, incoming):
        layer_of = lambda k: k // self.E  # noqa: E731
        mine = [k for k in ev if layer_of(k) == layer_of(incoming)]
        full = len(res) >= self.C
        held = sum(1 for k in res if layer_of(k) == layer_of(incoming))
        if mine and (held >= self.quota or full):
            return min(mine, key=self.used.get)
        if not full:
            return None
        # borrow: the layer holding the most residents (ties: the lowest layer) with an
        # evictable one, its least recent
        sizes = {layer: sum(1 for k in res if layer_of(k) == layer) for layer in range(self.L)}
        for layer in sorted(sizes, key=lambda x: (-sizes[x], x)):
            if layer != layer_of(incoming) and any(layer_of(k) == layer for k in ev):
                return min((k for k in ev if layer_of(k) == layer), key=self.used.get)
        return None


class RefLFUPerfect(Rule):  # counts persist across evictions; ties: last touch, then key
    def __init__(self, *a):
        super().__init__(*a)
        self.count, self.touch = {}, {}

    def access(self, keys, res, p, b):
        for k in keys:
            self.count[k] = self.count.get(k, 0) + 1
            self.touch[k] = self.tick()

    def insert(self, key, p):
        self.touch[key] = self.tick()

    def victim(self, ev, res, incoming):
        if len(res) < self.C:
            return None
        return min(ev, key=lambda k: (self.count.get(k, 0), self.touch[k], k))


class RefLFU(RefLFUPerfect):  # in-cache: an evicted key's count starts again from 0
    def evicted(self, key):
        self.count.pop(key, None)


class RefLFRU(Rule):  # clock ticks per hit and per landing; freq since landing; freq / age
    def __init__(self, *a):
        super().__init__(*a)
        self.clock, self.freq, self.last = 0, {}, {}

    def access(self, keys, res, p, b):
        for k in keys:
            if k in res:
                self.clock += 1
                self.freq[k] += 1
                self.last[k] = self.clock

    def insert(self, key, p):
        self.clock += 1
        self.freq[key], self.last[key] = 1, self.clock

    def victim(self, ev, res, incoming):
        if len(res) < self.C:
            return None
        return min(ev, key=lambda k: (Fraction(self.freq[k], self.clock - self.last[k] + 1),
                                      self.last[k], k))


class RefLeastStale(Rule):  # mark = (pass of the first touch in the latest pass, its order)
    def __init__(self, *a):
        super().__init__(*a)
        self.mark = {}

    def access(self, keys, res, p, b):
        for k in keys:
            if k in res and self.mark[k][0] != p:
                self.mark[k] = (p, self.tick())

    def insert(self, key, p):
        self.mark[key] = (p, self.tick())

    def victim(self, ev, res, incoming):
        # stale keys have an older pass than fresh ones, so min over (pass, order) takes
        # the stale tier first, FIFO in it, then the fresh tier FIFO
        return min(ev, key=self.mark.get) if len(res) >= self.C else None


class RefLIFOInactive(Rule):
    def __init__(self, *a):
        super().__init__(*a)
        self.landed, self.active_pass, self.pass_now = {}, {}, -1

    def access(self, keys, res, p, b):
        self.pass_now = p
        for k in keys:
            self.active_pass[k] = p

    def insert(self, key, p):
        self.landed[key] = self.tick()
        self.active_pass[key] = p

    def victim(self, ev, res, incoming):
        if len(res) < self.C:
            return None
        inactive = [k for k in ev if self.active_pass.get(k) != self.pass_now]
        return max(inactive or ev, key=self.landed.get)


class RefEvictAfterUse(Rule):  # names a victim even when a slot is free
    def __init__(self, *a):
        super().__init__(*a)
        self.landed, self.step_block, self.block_now = {}, {}, -1

    def access(self, keys, res, p, b):
        self.block_now = b
        for k in keys:
            self.step_block[k] = b

    def insert(self, key, p):
        self.landed[key] = self.tick()
        self.step_block[key] = self.block_now

    def victim(self, ev, res, incoming):
        used = [k for k in ev if self.step_block.get(k) != self.block_now]
        if used:
            return min(used, key=self.landed.get)
        return min(ev, key=self.landed.get) if ev and len(res) >= self.C else None


class RefBelady(Rule):  # placeholder: belady is REF_MIN below (it may wait, not pin)
    pass


def reference_min(trace, C: int) -> tuple[int, int, list[int]]:
    """Belady's MIN over the flat access sequence (blocks in engine order, a block's keys
    ascending): a miss evicts the resident whose next access is farthest (never: infinity;
    ties: the lowest key), any resident, including a key of the current block already
    accessed. The engine's belady gets there by waiting for such a key to run (its docstring);
    so for belady, unlike the other rules, the current block is not pinned."""
    seq = [k for _, _, keys in blocks_of(trace) for k in keys]
    resident, hits, misses, victims = set(), 0, 0, []
    for i, k in enumerate(seq):
        if k in resident:
            hits += 1
            continue
        misses += 1
        if len(resident) >= C:
            def next_use(x, i=i):
                return next((j for j in range(i + 1, len(seq)) if seq[j] == x), float("inf"))
            v = min(resident, key=lambda x: (-next_use(x), x))
            resident.discard(v)
            victims.append(v)
        resident.add(k)
    return hits, misses, victims


REF = {"fifo": RefFIFO, "lru": RefLRU, "lru_per_layer": RefLRUPerLayer, "lfu": RefLFU,
       "lfu_perfect": RefLFUPerfect, "lfru": RefLFRU, "least_stale": RefLeastStale,
       "lifo_inactive": RefLIFOInactive, "evict_after_use": RefEvictAfterUse,
       "belady": RefBelady}


def reference(name: str, trace, C: int) -> tuple[int, int, list[int]]:
    """(hits, misses, victims) of REF with rule `name`."""
    if name == "belady":
        return reference_min(trace, C)
    blocks = blocks_of(trace)
    assert C >= max(len(keys) for _, _, keys in blocks), "REF needs C >= the largest block"
    rule = REF[name](C, trace.num_layers, trace.num_experts, blocks)
    resident, hits, misses, victims = set(), 0, 0, []
    for b, (p, _layer, keys) in enumerate(blocks):
        rule.access(keys, resident, p, b)
        missing = [k for k in keys if k not in resident]
        hits += len(keys) - len(missing)
        misses += len(missing)
        for k in missing:
            evictable = resident - set(keys)
            v = rule.victim(evictable, resident, k)
            if v is not None:
                assert v in evictable
                resident.discard(v)
                rule.evicted(v)
                victims.append(v)
            assert len(resident) < C, f"REF {name}: full cache and no victim"
            resident.add(k)
            rule.insert(k, p)
    return hits, misses, victims
