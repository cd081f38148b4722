"""The minimal reference loop `moebench bench-sim` times next to the engine: a per-layer LRU
(one OrderedDict per MoE layer) over a trace's access stream at batch 1.

It is the speed yardstick of the machine the benchmark runs on: engine accesses per CPU
second divided by this loop's is the figure that survives a noisy, shared machine. It also
mimics lru_per_layer without prefetch (`system=lru system.prefetch=false`) rule for rule, so
its hit / miss counts must equal that run's (the benchmark checks it):
- the stream is the engine's at batch 1: iterations in the static schedule's order, MoE
  layers ascending, the block's expert union in ascending id (core/access.py, kept here as
  expert ids per block);
- routed residents move to most recent in ascending id, then each absent expert, in
  ascending id, evicts the least recent expert of its layer that the block does not use
  once the layer holds `slots_per_layer` (or the cache is full), and enters as most recent;
  since the block's own experts are then the most recent ones, that victim is the layer's
  least recent entry unless the whole layer is in use (no walk: a tighter yardstick);
- when the layer has no such expert and the cache is full it borrows the least recent
  expert of the layer holding the most (ties: the lowest layer). At batch 1 with no
  prefetch every copy has landed before the next block, so only the running block's
  experts are unevictable.
"""

from __future__ import annotations

from collections import OrderedDict

from core.access import access_sequence


def access_stream(trace) -> list[tuple[int, list[int], int]]:
    """(layer, ascending expert ids, 1 if prefill else 0) per non-empty block, batch 1: the
    engine-order sequence of core/access.py, as expert ids per block."""
    seq = access_sequence(trace, 1)
    E, kinds = trace.num_experts, seq.iteration_kinds
    return [(layer, [k - layer * E for k in keys], 1 if kinds[it] == "prefill" else 0)
            for _, it, layer, keys in seq.blocks()]


def replay(stream, num_layers: int, capacity_slots: int, slots_per_layer: int) -> dict:
    """Per-layer LRU over `stream`; counts {hits,misses}_{decode,prefill}. Kept as tight as
    plain Python allows (a yardstick that is slow flatters the engine's ratio)."""
    layers = [OrderedDict() for _ in range(num_layers)]
    resident = 0
    hits, misses = [0, 0], [0, 0]  # [decode, prefill]
    for layer, experts, phase in stream:
        lru = layers[layer]
        absent = None
        for e in experts:
            if e in lru:
                lru.move_to_end(e)
            elif absent is None:
                absent = [e]
            else:
                absent.append(e)
        if absent is None:
            hits[phase] += len(experts)
            continue
        hits[phase] += len(experts) - len(absent)
        misses[phase] += len(absent)
        in_use = set(experts)
        for e in absent:
            full = resident >= capacity_slots
            if full or len(lru) >= slots_per_layer:
                # The block's residents moved to most recent and its new experts enter
                # after them, so the least recent entry is evictable unless the whole
                # layer is in use: no walk is needed.
                victim = next(iter(lru), None)
                if victim is not None and victim not in in_use:
                    del lru[victim]
                elif full:
                    _borrow(layers, lru)
                else:
                    resident += 1
            else:
                resident += 1
            lru[e] = None
    return {"hits_decode": hits[0], "misses_decode": misses[0],
            "hits_prefill": hits[1], "misses_prefill": misses[1]}


def _borrow(layers, lru) -> None:
    """Evict the least recent expert of the fullest other layer (max keeps the lowest layer
    among equals); other layers hold no in-use expert at batch 1."""
    other = max((d for d in layers if d is not lru), key=len)
    if not other:
        raise RuntimeError("reference LRU: no victim while the cache is full")
    other.popitem(last=False)


def stream_accesses(stream) -> int:
    return sum(len(experts) for _, experts, _ in stream)
