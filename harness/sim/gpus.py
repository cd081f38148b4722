"""Several GPUs: the run's GPU count, peer link and placement, and the links between GPUs.

The contract is docs/gpus.md. In short, with `hardware.num_gpus` = N and a placement
(systems/placements/): each GPU has its own expert cache of the memory plan's size, its own
copy engine on its own host link and its own instance of the system (harness/sim/
step_gpus.py); request r's tokens live on GPU r % N; an expert runs on the GPU the placement
names and a token routed to it from another GPU costs a message there and one back (the
all-to-all); a miss is copied from a peer GPU that holds the expert before the host
(harness/sim/copies_gpu.py). One GPU and no placement is the single-GPU engine, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from core.knobs import KnobError
from core.schedule import static_schedule
from core.spec_base import SpecError


@dataclass
class Gpus:
    """A run's GPUs as configured: `num_gpus`, the peer link (PeerSpec or None), the
    placement (a Placement or None), the host link (1e9 B/s, us: the path between GPUs
    without a direct peer link) and `make_system()`, a fresh system for each GPU after the
    first (the run's own system is the first GPU's)."""

    num_gpus: int
    peer: object
    placement: object
    host_gbps: float
    host_latency_us: float
    make_system: Callable | None = None
    calibration_sha: str | None = None  # the split a placement ranked experts by, if any
    # one GPU's cache slots the placement sizes itself by (None: the engine's cache's; the
    # compute floor's engine holds every expert, and passes the run's)
    placement_slots: int | None = None

    def active(self) -> bool:
        return self.num_gpus > 1 or self.placement is not None

    def check(self, model, tiered: bool) -> None:
        """Refuse what the multi-GPU engine cannot run (SpecError naming the key)."""
        if not self.active():
            return
        if self.placement is None:
            raise SpecError(f"placement: {self.num_gpus} GPUs need a placement of the experts "
                            "(placement=shard_expert, shard_layer or replicate_hot)")
        if tiered:
            raise SpecError("hardware.num_gpus: several GPUs with bounded host memory, an "
                            "NVMe tier or CPU-run misses are not modelled (docs/gpus.md)")
        try:
            self.placement.check(self.num_gpus, model.num_moe_layers, model.num_experts)
        except KnobError as exc:
            raise SpecError(str(exc)) from exc

    def floor_key(self) -> tuple:
        """What a compute floor on these GPUs depends on (harness/runner/floor.py)."""
        return (self.num_gpus, repr(self.peer), self.host_gbps, self.host_latency_us,
                repr(sorted(self.placement.describe().items())), self.calibration_sha,
                self.placement_slots)

    def links(self) -> PeerLinks:
        return PeerLinks(self.peer, self.num_gpus, self.host_gbps, self.host_latency_us)


class PeerLinks:
    """Each GPU's peer port, one direction each way: a message from a to b waits for a's send
    side and b's receive side, pays the link's latency and its bytes at the link's rate.
    Directly linked GPUs use the peer link; the others (topology `pairs`) go through host
    memory: two copies' latency at the host link's rate. `bytes[a][b]` sums what a sent b."""

    def __init__(self, peer, num_gpus: int, host_gbps: float, host_latency_us: float):
        self.peer = peer
        self.send_free_ms = [0.0] * num_gpus
        self.recv_free_ms = [0.0] * num_gpus
        self.bytes = [[0] * num_gpus for _ in range(num_gpus)]
        self.messages = 0
        direct = peer is not None
        self._rate = {}  # (a, b) -> (latency ms, bytes per ms)
        for a in range(num_gpus):
            for b in range(num_gpus):
                if direct and peer.direct(a, b):
                    self._rate[a, b] = (peer.peer_latency_us / 1e3, peer.peer_gbps * 1e6)
                else:
                    self._rate[a, b] = (2 * host_latency_us / 1e3, host_gbps * 1e6)

    def direct(self, a: int, b: int) -> bool:
        return self.peer is not None and self.peer.direct(a, b)

    def send(self, a: int, b: int, nbytes: int, t: float) -> tuple[float, float]:
        """(start, arrival) ms of `nbytes` from GPU a to GPU b, ready to go at t."""
        latency_ms, per_ms = self._rate[a, b]
        start = max(t, self.send_free_ms[a], self.recv_free_ms[b])
        end = start + latency_ms + nbytes / per_ms
        self.send_free_ms[a] = self.recv_free_ms[b] = end
        self.bytes[a][b] += nbytes
        self.messages += 1
        return start, end


class GpuAccesses:
    """`keep(keys, iterations)`: which accesses of the access sequence (core/access.py) GPU
    `gpu` runs, for the oracle family's plans (SystemContext.gpu_accesses): a key with one
    owner where that owner is `gpu`; a key every GPU may hold where `gpu` is the home of a
    request of the access's iteration (with several requests in an iteration that is more
    than the GPU runs: the sequence merges the requests' experts)."""

    def __init__(self, placement, trace, max_batch: int, gpu: int):
        self.placement, self.trace, self.max_batch, self.gpu = placement, trace, max_batch, gpu

    def __call__(self, keys: np.ndarray, iterations: np.ndarray) -> np.ndarray:
        p, gpu, tr = self.placement, self.gpu, self.trace
        schedule = static_schedule(tr.arrival_ms, tr.output_len, self.max_batch)
        home = np.zeros(len(schedule), dtype=bool)  # [I] gpu holds a member's tokens
        for i, (_, members) in enumerate(schedule):
            home[i] = any(p.home(r) == gpu for r, _ in members)
        sole = np.array([o[0] if len(o) == 1 else -1 for o in p.owners], dtype=np.int64)
        everywhere = np.array([len(o) == p.num_gpus for o in p.owners], dtype=bool)
        return (sole[keys] == gpu) | (everywhere[keys] & (sole[keys] == -1) & home[iterations])
