"""TorchBackend: real expert weights behind the engine (docs/real-backend.md).

Expert weights live in host memory (pinned when the device is CUDA), one list of tensors per
expert key (key = layer * num_experts + expert). The device holds a fixed pool of slots, one
slot = one expert's tensors, as many slots as the engine's cache has. The engine calls
`load_expert(key, kind)` when it commits a copy and `evict_expert(key)` when it evicts; it
runs experts through `weights(key)`, which makes the compute stream wait for that key's copy
only. On CUDA copies run on a dedicated stream and each records an event; on CPU slots are
separate tensors and a copy is a real `copy_` of the bytes.

`h2d_bytes` / `preload_bytes` count the bytes this backend actually copied, independently of
the engine's recorder (the lossless test compares the two).
"""

from __future__ import annotations

import time

import torch

PREFETCH, DEMAND, PRELOAD = 0, 1, 2  # as harness.sim.recorder (kept in step by a test)


class TorchBackend:
    name = "torch"

    def __init__(self, host: dict[int, list[torch.Tensor]], num_slots: int,
                 device: str | torch.device = "cpu", copy_ms: float | None = None):
        if not host:
            raise ValueError("TorchBackend: no expert weights given")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        first = next(iter(host.values()))
        self.shapes = [(t.shape, t.dtype) for t in first]
        for key, ts in host.items():
            if [(t.shape, t.dtype) for t in ts] != self.shapes:
                raise ValueError(f"TorchBackend: expert {key} differs in shape from the others")
        if self.cuda:
            host = _pin(host)
            self.copy_stream = torch.cuda.Stream(self.device)
        self.host = host
        self.expert_bytes = sum(t.numel() * t.element_size() for t in first)
        self.slots = [[torch.empty(s, dtype=d, device=self.device) for s, d in self.shapes]
                      for _ in range(num_slots)]
        self.free = list(range(num_slots - 1, -1, -1))
        self.slot_of: dict[int, int] = {}
        self.events: dict[int, torch.cuda.Event] = {}
        self._cpu_wait_ms: dict[int, float] = {}
        self.h2d_bytes = 0
        self.preload_bytes = 0
        self.copies = 0
        self._t0 = time.perf_counter()
        self.expert_copy_ms = copy_ms if copy_ms is not None else self._measure_copy_ms()

    # ---- clock ------------------------------------------------------------------------------
    def reset_clock(self) -> None:
        self._t0 = time.perf_counter()

    def now_ms(self) -> float:
        """Real time since reset_clock; on CUDA after the compute stream has drained."""
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
        return (time.perf_counter() - self._t0) * 1e3

    # ---- copies -----------------------------------------------------------------------------
    def load_expert(self, key: int, kind: int) -> None:
        if key in self.slot_of:
            raise RuntimeError(f"TorchBackend: expert {key} is already resident")
        if not self.free:
            raise RuntimeError("TorchBackend: no free device slot (engine and backend disagree)")
        slot = self.free.pop()
        self.slot_of[key] = slot
        src, dst = self.host[key], self.slots[slot]
        if self.cuda:
            # The slot may still be read by an expert queued on the compute stream.
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.copy_stream):
                for d, s in zip(dst, src):
                    d.copy_(s, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.copy_stream)
            self.events[key] = ev
        else:
            # No overlap on CPU: a demand copy blocks the expert that needs it (its stall).
            t0 = time.perf_counter()
            for d, s in zip(dst, src):
                d.copy_(s)
            if kind == DEMAND:
                self._cpu_wait_ms[key] = (time.perf_counter() - t0) * 1e3
        if kind == PRELOAD:
            self.preload_bytes += self.expert_bytes
        else:
            self.h2d_bytes += self.expert_bytes
            self.copies += 1

    def evict_expert(self, key: int) -> None:
        self.events.pop(key, None)
        self._cpu_wait_ms.pop(key, None)
        self.free.append(self.slot_of.pop(key))

    def weights(self, key: int) -> tuple[list[torch.Tensor], float]:
        """(slot tensors of a resident expert, ms compute waited for its copy). On CUDA the
        compute stream waits on the copy's event; the host also waits on it to measure the
        stall (now_ms drains the compute stream after every expert, so none is hidden)."""
        ev = self.events.pop(key, None)
        wait_ms = self._cpu_wait_ms.pop(key, 0.0)
        if ev is not None:
            t0 = time.perf_counter()
            ev.synchronize()
            wait_ms = (time.perf_counter() - t0) * 1e3
            torch.cuda.current_stream(self.device).wait_event(ev)
        return self.slots[self.slot_of[key]], wait_ms

    def _measure_copy_ms(self, reps: int = 3) -> float:
        """Median time of one expert's host-to-device copy (the engine's ready estimate)."""
        src, dst = next(iter(self.host.values())), self.slots[0] if self.slots else None
        if dst is None:
            return 0.0
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for d, s in zip(dst, src):
                d.copy_(s, non_blocking=self.cuda)
            if self.cuda:
                torch.cuda.synchronize(self.device)
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]


def _pin(host: dict[int, list[torch.Tensor]]) -> dict[int, list[torch.Tensor]]:
    """Copy every expert into one pinned buffer (one allocation: the pinned caching
    allocator would round each small tensor up to a power of two)."""
    first = next(iter(host.values()))
    dtypes = {t.dtype for t in first}
    if len(dtypes) != 1:
        return {k: [t.pin_memory() for t in ts] for k, ts in host.items()}
    per = sum(t.numel() for t in first)
    buf = torch.empty(per * len(host), dtype=first[0].dtype, pin_memory=True)
    out, off = {}, 0
    for key, ts in host.items():
        views = []
        for t in ts:
            v = buf[off:off + t.numel()].view(t.shape)
            v.copy_(t)
            views.append(v)
            off += t.numel()
        out[key] = views
    return out
