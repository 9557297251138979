"""What the bundled runtime can run on one machine, as a value the rules read.

The planner never imports torch or vLLM, so it cannot look at the machine: the runtime detects it
(`rlplan.runtime.platform.detect_platform`) and passes this value to `check_plan(plan, platform)`,
whose "platform" rules refuse the knobs this machine cannot honour. Each property says why.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import field, frozen

DEVICE_TYPES = ("cuda", "cpu")


@frozen(kw_only=True)
class Platform:
    """The device kind the trainer and the rollout run on, and how many of them one node has."""

    device_type: str = field(validator=attrs.validators.in_(DEVICE_TYPES))
    accelerator_count: int = field(default=0, validator=attrs.validators.ge(0))
    # A C++ compiler on PATH: vLLM's CPU backend compiles its model with torch.compile (inductor), which
    # builds C++ kernels; without one only an eager engine starts.
    has_cpp_compiler: bool = True

    @property
    def has_accelerator(self) -> bool:
        return self.device_type != "cpu"

    @property
    def process_group_backend(self) -> str:
        return "nccl" if self.device_type == "cuda" else "gloo"

    @property
    def supports_sleep_mode(self) -> bool:
        # vLLM's CPU backend rejects enable_sleep_mode and turns sleep()/wake_up() into no-ops.
        return self.has_accelerator

    @property
    def supports_host_offload(self) -> bool:
        # FSDP2's CPUOffloadPolicy and activation offload move tensors from an accelerator to the
        # host; on a CPU-only machine they already live there and CPUOffloadPolicy raises.
        return self.has_accelerator

    @property
    def supports_compiled_rollout(self) -> bool:
        # On GPUs vLLM captures CUDA graphs; on a CPU it compiles C++ kernels, which needs the compiler.
        return self.has_accelerator or self.has_cpp_compiler

    @property
    def supports_tensor_parallel_rollout(self) -> bool:
        # On GPUs the runtime colocates one single-GPU engine with each trainer rank; on CPU the one
        # engine runs its TP ranks as worker processes beside it (shared memory).
        return not self.has_accelerator


# What rlplan's CPU runtime cannot do (or does not need) on a CPU cluster: `solve --device cpu` and the demo
# pin these, the rest is solved. Offload needs an accelerator (runtime.platform), vLLM's CPU backend runs
# without sleep mode, one engine per process.
CPU_RUNTIME_PINS: dict[str, Any] = {
    "actor.param_offload": False,
    "actor.optimizer_offload": False,
    "actor.offload_policy": False,
    "critic.offload_policy": False,
    "ref.param_offload": False,
    "model.activation_offload": False,
    "actor.ulysses_sequence_parallel_size": 1,
    "rollout.tensor_model_parallel_size": 1,
    "rollout.free_cache_engine": False,
    "rollout.load_format": "safetensors",
    "actor.use_dynamic_bsz": True,
    "rollout.log_prob_use_dynamic_bsz": True,
    "ref.log_prob_use_dynamic_bsz": True,
}
