"""The optional parts of a hardware profile: the host (DRAM, CPU) and an NVMe tier below it.

conf/hardware/host/*.yaml lands at `hardware.host`, conf/hardware/nvme/*.yaml at
`hardware.nvme` (docs/hardware.md says what each value models). Absent, host memory is
unbounded and nothing runs on the CPU: every result of a profile without them is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.spec_base import GIB, SpecError, build_spec, positive


@dataclass(frozen=True)
class HostSpec:
    name: str
    display_name: str
    dram_gb: float  # host DRAM installed, GiB
    reserve_gb: float  # GiB not available to expert weights (OS, framework, staging buffers)
    mem_gbps: float  # DRAM read bandwidth, 1e9 B/s: what a CPU-run expert streams its weights at
    cpu_tflops: float  # the CPU's dense matmul throughput for expert FFNs, 1e12 FLOP/s
    cpu_expert_overhead_us: float  # fixed cost of one expert call on the CPU

    @property
    def expert_capacity_bytes(self) -> int:
        """Host DRAM left for expert weights."""
        return int((self.dram_gb - self.reserve_gb) * GIB)


@dataclass(frozen=True)
class NvmeSpec:
    name: str
    display_name: str
    capacity_gb: float  # GiB
    read_gbps: float  # sequential read bandwidth, 1e9 B/s, shared by the reads in flight
    latency_us: float  # per-read latency before its first byte
    queue_depth: int  # reads in flight at once (their latencies overlap)
    chunk_mb: float  # staging chunk (1e6 B): a GPU copy starts once its first chunk is in DRAM

    @property
    def capacity_bytes(self) -> int:
        return int(self.capacity_gb * GIB)


def host_spec_from_dict(data: dict, where: str = "hardware.host") -> HostSpec:
    host = build_spec(HostSpec, data, where, {"reserve_gb", "cpu_expert_overhead_us"})
    if host.reserve_gb >= host.dram_gb:
        raise SpecError(f"{where}.reserve_gb: {host.reserve_gb} GiB leaves none of dram_gb "
                        f"{host.dram_gb} GiB for experts")
    return host


def nvme_spec_from_dict(data: dict, where: str = "hardware.nvme") -> NvmeSpec:
    return build_spec(NvmeSpec, data, where, {"latency_us"}, {"queue_depth"})


def dequant_table(data, where: str) -> tuple[tuple[int, float], ...]:
    """{bits: 1e9 params/s} -> ((bits, rate), ...) ascending; bits an integer in 1..15 (a
    yaml or command-line key may arrive as a string of digits)."""
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping bits -> 1e9 parameters per s")
    out = []
    for bits, rate in data.items():
        b = int(bits) if isinstance(bits, str) and bits.isdigit() else bits
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 15:
            raise SpecError(f"{where}: key {bits!r} must be a bit-width from 1 to 15")
        out.append((b, positive(where, str(b), rate)))
    return tuple(sorted(out))
