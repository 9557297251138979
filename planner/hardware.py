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
