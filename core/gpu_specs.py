"""Several GPUs: the peer link between them (conf/hardware/peer/*.yaml, at `hardware.peer`).

A profile with `hardware.num_gpus` > 1 needs a peer link; one GPU needs none, and a profile
without either (every conf/hardware/*.yaml) runs on one GPU exactly as before. docs/gpus.md
says what each value models.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.spec_base import SpecError, build_spec, positive

# How the GPUs are joined: `all` every pair directly (NVSwitch, or a full NVLink mesh);
# `pcie` every pair through the PCIe switch (P2P); `pairs` GPUs 2i and 2i+1 by a bridge and
# the other pairs through host memory, at the host link's rate (GeForce cards have no PCIe P2P).
TOPOLOGIES = ("all", "pcie", "pairs")


@dataclass(frozen=True)
class PeerSpec:
    name: str
    display_name: str
    peer_gbps: float  # one direction of one GPU-to-GPU link, 1e9 B/s
    peer_latency_us: float  # fixed cost of one peer copy or all-to-all message
    topology: str  # one of TOPOLOGIES

    def direct(self, a: int, b: int) -> bool:
        """True when GPUs `a` and `b` share a peer link (else: through host memory)."""
        return self.topology != "pairs" or a // 2 == b // 2


def peer_spec_from_dict(data, where: str) -> PeerSpec:
    peer = build_spec(PeerSpec, data, where, zero_ok={"peer_latency_us"}, strings={"topology"})
    if peer.topology not in TOPOLOGIES:
        raise SpecError(f"{where}.topology: must be one of {', '.join(TOPOLOGIES)}, "
                        f"got {peer.topology!r}")
    return peer


def check_gpus(num_gpus, peer: PeerSpec | None, where: str) -> int:
    """`hardware.num_gpus` as an int >= 1; several GPUs need a peer link (pairs: an even
    count)."""
    n = positive(where, "num_gpus", num_gpus, integer=True)
    if n > 1 and peer is None:
        raise SpecError(f"{where}.num_gpus: {n} GPUs need a peer link between them; pick "
                        "hardware/peer=<profile> (conf/hardware/peer)")
    if peer is not None and peer.topology == "pairs" and n > 1 and n % 2:
        raise SpecError(f"{where}.num_gpus: {peer.name} joins GPUs in bridged pairs; "
                        f"{n} GPUs leave one unpaired")
    return n
