"""The cluster a plan runs on: GPU kind, node count, host memory."""

from __future__ import annotations

import math

import attrs
from attrs import frozen

from rlplan.planner.validators import field_check

# No GPU, node count or link speed comes near this; beyond it byte counts overflow float arithmetic.
_IMPLAUSIBLY_LARGE = 1e9


def _positive_number(field_prefix: str):
    return field_check(field_prefix, lambda value: math.isfinite(value) and 0 < value <= _IMPLAUSIBLY_LARGE,
                       f"must be positive and below {_IMPLAUSIBLY_LARGE:g}, got {{value}}.",
                       "set {field} to a positive number")


@frozen(kw_only=True)
class GpuSpec:
    """One accelerator: memory and the roofline numbers the step-time model uses."""

    name: str
    memory_gib: float = attrs.field(validator=_positive_number("cluster.gpu"))
    bf16_tflops: float = attrs.field(default=989.0, validator=_positive_number("cluster.gpu"))
    hbm_gbps: float = attrs.field(default=3350.0, validator=_positive_number("cluster.gpu"))
    # Host<->device bandwidth for offload traffic, per GPU.
    pcie_gbps: float = attrs.field(default=25.0, validator=_positive_number("cluster.gpu"))
    # Intra-node GPU<->GPU bandwidth per GPU (NVLink / Infinity Fabric / PCIe).
    intranode_gbps: float = attrs.field(default=450.0, validator=_positive_number("cluster.gpu"))

    @property
    def is_cpu(self) -> bool:
        """rlplan's bundled runtime on CPU ranks names its device "cpu" (runtime.commands, runtime.tiny)."""
        return self.name.lower() == "cpu"


@frozen(kw_only=True)
class Cluster:
    """Nodes of identical GPUs."""

    gpu: GpuSpec
    nodes: int = attrs.field(default=1, validator=_positive_number("cluster"))
    gpus_per_node: int = attrs.field(default=8, validator=_positive_number("cluster"))
    host_memory_gib: float = attrs.field(default=1024.0, validator=_positive_number("cluster"))
    # Inter-node bandwidth per GPU (InfiniBand / RoCE), for cross-node collectives.
    internode_gbps: float = attrs.field(default=50.0, validator=_positive_number("cluster"))

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu_memory_bytes(self) -> int:
        return int(self.gpu.memory_gib * 2**30)

    @property
    def host_memory_bytes_per_node(self) -> int:
        return int(self.host_memory_gib * 2**30)


# --- the CPU as a platform (rlplan's bundled runtime without an accelerator) ------------------------

# fp32 FLOPs per cycle per core of one FMA pipe: vector lanes x 2 (multiply and add). The trainer of the
# CPU runtime computes in fp32; AMX accelerates bf16/int8 tiles, which its fp32 matmuls do not use.
_FP32_FLOPS_PER_CYCLE = (("avx512f", 32), ("avx2", 16), ("avx", 8), ("sse2", 4))
# A core streams roughly this much DRAM bandwidth on its own (server and desktop x86 cores reach 8-15 GB/s
# single-threaded); with no measurement it is the whole estimate.
_ESTIMATED_GBPS_PER_CORE = 10.0
_DEFAULT_CPU_GHZ = 2.0


@frozen(kw_only=True)
class CpuRates:
    """This machine's compute and memory bandwidth, all cores together, and where the figures come from."""

    tflops: float = attrs.field(validator=_positive_number("cpu"))
    gbps: float = attrs.field(validator=_positive_number("cpu"))
    cores: int = attrs.field(validator=_positive_number("cpu"))
    source: str

    def per_rank(self, ranks: int, host_memory_gib: float) -> GpuSpec:
        """One trainer rank's share of the machine (cores, bandwidth, host RAM), as the 'device' the planner prices.

        Ranks run their passes at the same time on their share of the cores (runtime.platform
        cpu_threads_per_rank); host<->device and rank<->rank traffic are memory copies (gloo over loopback).
        """
        share = max(1, ranks)
        gbps = self.gbps / share
        return GpuSpec(name="cpu", memory_gib=host_memory_gib / share, bf16_tflops=self.tflops / share, hbm_gbps=gbps,
                       pcie_gbps=gbps, intranode_gbps=gbps)


def estimate_cpu_rates(cpuinfo: str, cores: int | None = None) -> CpuRates:
    """An estimate from /proc/cpuinfo's text: cores x clock x fp32 FLOPs per cycle, and a per-core bandwidth.

    `cores` is what the process may run on (its affinity), else the processors cpuinfo lists.
    A measured figure (`rlplan calibrate --cpu`) replaces this.
    """
    blocks = [block for block in cpuinfo.split("\n\n") if "processor" in block]
    listed = max(1, len(blocks))
    count = cores or listed
    fields: dict[str, str] = {}
    for line in (blocks[0] if blocks else cpuinfo).splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    flags = set(fields.get("flags", "").split())
    per_cycle = next((flops for flag, flops in _FP32_FLOPS_PER_CYCLE if flag in flags), 2)
    try:
        ghz = float(fields.get("cpu mhz", "")) / 1000.0
    except ValueError:
        ghz = _DEFAULT_CPU_GHZ
    if not math.isfinite(ghz) or ghz <= 0:
        ghz = _DEFAULT_CPU_GHZ
    isa = next((flag for flag, _ in _FP32_FLOPS_PER_CYCLE if flag in flags), "scalar")
    amx = ", AMX (unused by fp32 training)" if "amx_tile" in flags else ""
    return CpuRates(
        tflops=count * ghz * per_cycle / 1000.0,
        gbps=count * _ESTIMATED_GBPS_PER_CORE,
        cores=count,
        source=f"estimated from /proc/cpuinfo: {count} cores x {ghz:.2f} GHz x {per_cycle} fp32 FLOP/cycle "
               f"({isa}{amx}), {_ESTIMATED_GBPS_PER_CORE:g} GB/s per core; `rlplan calibrate --cpu` measures them",
    )


def measured_cpu_rates(tflops: float, gbps: float, cores: int) -> CpuRates:
    return CpuRates(tflops=tflops, gbps=gbps, cores=cores,
                    source=f"measured by `rlplan calibrate --cpu`: {tflops * 1000:.1f} GFLOP/s, {gbps:.1f} GB/s")
