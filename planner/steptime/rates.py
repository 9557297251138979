"""Achieved rates of a cluster under a profile (FLOP/s, HBM, PCIe, collective bandwidth) and the ring
collective every phase's communication is priced with."""

from __future__ import annotations

from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile

GB = 1e9


def training_mfu_key(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> str:
    """The profile key of the MFU a trainer pass reaches on the plan's GPU class.

    FLOP-dense GPUs (H100, H200, B200, MI300X: at least `training_mfu_dense_gpu_tflops` bf16 TFLOP/s) stay
    further from their peak than GPUs with few FLOPs per byte of HBM (H20, A100, L40S): the same kernels,
    launches and collectives cost a larger share of a faster GPU's time.  A CPU plan keeps training_mfu,
    which `calibrate --cpu` fits.
    """
    gpu = plan.cluster.gpu
    if gpu.is_cpu or gpu.bf16_tflops >= profile.training_mfu_dense_gpu_tflops:
        return "training_mfu"
    return "training_mfu_light_gpu"


class Rates:
    """Achieved rates of one cluster under a profile, in FLOP/s and bytes/s."""

    __slots__ = ("gpu", "training_mfu", "prefill_flops", "decode_flops", "hbm", "pcie", "intranode",
                 "internode",
                 "gpus_per_node")

    def __init__(self, plan: Plan, profile: Profile) -> None:
        gpu = plan.cluster.gpu
        self.gpu = gpu
        self.training_mfu = float(getattr(profile, training_mfu_key(plan, profile)))
        # The engine computes in its own dtype (rollout.dtype): on a CPU bf16 and fp32 rates differ by ~2x either way.
        self.prefill_flops = gpu.tflops(plan.rollout.dtype) * 1e12 * profile.prefill_mfu
        self.decode_flops = gpu.tflops(plan.rollout.dtype) * 1e12 * profile.decode_mfu
        self.hbm = gpu.hbm_gbps * GB * profile.decode_hbm_efficiency
        self.pcie = gpu.pcie_gbps * GB * profile.pcie_efficiency
        self.intranode = gpu.intranode_gbps * GB * profile.collective_efficiency
        self.internode = min(gpu.intranode_gbps, plan.cluster.internode_gbps) * GB * profile.collective_efficiency
        self.gpus_per_node = plan.cluster.gpus_per_node

    def train_flops(self, compute_dtype: str) -> float:
        """Achieved FLOP/s of a trainer pass computing in `compute_dtype` (the role's compute_dtype)."""
        return self.gpu.tflops(compute_dtype) * 1e12 * self.training_mfu

    def collective(self, group_size: int) -> float:
        """Bandwidth of a collective over `group_size` ranks: NVLink-class inside a node, the NIC across."""
        return self.intranode if group_size <= self.gpus_per_node else self.internode


def ring_seconds(total_bytes: float, group_size: int, bandwidth: float) -> float:
    """A ring all-gather or reduce-scatter of `total_bytes` (the unsharded size) over `group_size` ranks."""
    if group_size <= 1:
        return 0.0
    return total_bytes * (group_size - 1) / group_size / bandwidth
