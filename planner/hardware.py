"""The cluster a plan runs on: GPU kind, node count, host memory."""

from __future__ import annotations

import math

import attrs
from attrs import frozen

from rlplan.planner.validators import field_check

# No GPU, node count or link speed comes near this; beyond it byte counts overflow float arithmetic.
_IMPLAUSIBLY_LARGE = 1e9


def _finite_positive(value: object) -> bool:
    """A positive finite number; a bool, a string or an int past float's range (math.isfinite's OverflowError) is not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return value > 0 and (isinstance(value, int) or math.isfinite(value))


def _positive_number(field_prefix: str):
    return field_check(field_prefix, lambda value: _finite_positive(value) and value <= _IMPLAUSIBLY_LARGE,
                       f"must be positive and below {_IMPLAUSIBLY_LARGE:g}, got {{value}}.",
                       "set {field} to a positive number")


@frozen(kw_only=True)
class GpuSpec:
    """One accelerator: memory and the roofline numbers the step-time model uses."""

    name: str
    memory_gib: float = attrs.field(validator=_positive_number("cluster.gpu"))
    bf16_tflops: float = attrs.field(default=989.0, validator=_positive_number("cluster.gpu"))
    # Dense fp32 matmul rate, where it differs from half the bf16 rate: a CPU's vector units (where bf16 may
    # be slower than fp32). Unset on GPUs, which verl runs in bf16 only.
    fp32_tflops: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(_positive_number("cluster.gpu")))
    hbm_gbps: float = attrs.field(default=3350.0, validator=_positive_number("cluster.gpu"))
    # Host<->device bandwidth for offload traffic, per GPU.
    pcie_gbps: float = attrs.field(default=25.0, validator=_positive_number("cluster.gpu"))
    # Intra-node GPU<->GPU bandwidth per GPU (NVLink / Infinity Fabric / PCIe).
    intranode_gbps: float = attrs.field(default=450.0, validator=_positive_number("cluster.gpu"))

    @property
    def is_cpu(self) -> bool:
        """rlplan's bundled runtime on CPU ranks names its device "cpu" (runtime.commands, runtime.tiny)."""
        return self.name.lower() == "cpu"

    def tflops(self, dtype: str) -> float:
        """Peak dense matmul TFLOP/s when computing in `dtype` (a plan's compute_dtype or rollout.dtype)."""
        if dtype == "float32":
            # Without a figure: TF32 tensor cores (A100, H100) run at half the bf16 dense rate.
            return self.fp32_tflops if self.fp32_tflops is not None else self.bf16_tflops / 2
        return self.bf16_tflops

    @property
    def fastest_compute_dtype(self) -> str:
        """The dtype its matmuls run fastest in: bfloat16 unless bf16 is slower (a CPU without native bf16)."""
        return "bfloat16" if self.bf16_tflops >= self.tflops("float32") else "float32"


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

# fp32 FLOPs per cycle per core of one FMA pipe: vector lanes x 2 (multiply and add).
_FP32_FLOPS_PER_CYCLE = (("avx512f", 32), ("avx2", 16), ("avx", 8), ("sse2", 4))
# bf16 matmul rate against fp32's, by the CPU's bf16 support. AVX512-BF16's dot products (vdpbf16ps) do two
# bf16 multiply-adds per fp32 lane: a 1536x512 by 512x1280 matmul ran 2.2x as fast in bf16 as in fp32 on one
# core of an AVX512-BF16 EPYC (`rlplan calibrate --cpu` measures both). AMX tiles go further, but how far
# depends on the shapes, so the estimate stays at AVX512-BF16's. Without either, oneDNN converts bf16 to fp32
# around fp32 kernels: slower than fp32 itself.
_BF16_SPEEDUP = (("amx_bf16", 2.0), ("avx512_bf16", 2.0))
_BF16_EMULATED_SPEEDUP = 0.5
# A core streams roughly this much DRAM bandwidth on its own (server and desktop x86 cores reach 8-15 GB/s
# single-threaded); with no measurement it is the whole estimate.
_ESTIMATED_GBPS_PER_CORE = 10.0
_DEFAULT_CPU_GHZ = 2.0


@frozen(kw_only=True)
class CpuRates:
    """This machine's compute and memory bandwidth, all cores together, and where the figures come from."""

    # Dense matmul TFLOP/s in fp32, and in bf16 (the trainer's and the engine's compute_dtype choose one).
    tflops: float = attrs.field(validator=_positive_number("cpu"))
    bf16_tflops: float = attrs.field(validator=_positive_number("cpu"))
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
        return GpuSpec(name="cpu", memory_gib=host_memory_gib / share, bf16_tflops=self.bf16_tflops / share,
                       fp32_tflops=self.tflops / share, hbm_gbps=gbps, pcie_gbps=gbps, intranode_gbps=gbps)

    def cluster(self, ranks: int, host_memory_gib: float) -> Cluster:
        """This machine as one node of `ranks` one-process trainer ranks sharing its cores and RAM."""
        return Cluster(gpu=self.per_rank(ranks, host_memory_gib), nodes=1, gpus_per_node=ranks,
                       host_memory_gib=host_memory_gib)


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
    bf16_flag, bf16_speedup = next(((flag, speedup) for flag, speedup in _BF16_SPEEDUP if flag in flags),
                                   ("no native bf16", _BF16_EMULATED_SPEEDUP))
    tflops = count * ghz * per_cycle / 1000.0
    return CpuRates(
        tflops=tflops,
        bf16_tflops=tflops * bf16_speedup,
        gbps=count * _ESTIMATED_GBPS_PER_CORE,
        cores=count,
        source=f"estimated from /proc/cpuinfo: {count} cores x {ghz:.2f} GHz x {per_cycle} fp32 FLOP/cycle "
               f"({isa}), bf16 at {bf16_speedup:g}x fp32 ({bf16_flag}), {_ESTIMATED_GBPS_PER_CORE:g} GB/s per "
               "core; `rlplan calibrate --cpu` measures them",
    )


def measured_cpu_rates(tflops: float, bf16_tflops: float, gbps: float, cores: int) -> CpuRates:
    return CpuRates(tflops=tflops, bf16_tflops=bf16_tflops, gbps=gbps, cores=cores,
                    source=f"measured by `rlplan calibrate --cpu`: {tflops * 1000:.1f} GFLOP/s fp32, "
                           f"{bf16_tflops * 1000:.1f} GFLOP/s bf16, {gbps:.1f} GB/s")
