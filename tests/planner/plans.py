"""Plans for tests, built with the schema directly (no presets, no files)."""

from __future__ import annotations

from typing import Any

import attrs

from rlplan.planner.arch import Architecture
from rlplan.planner.hardware import Cluster, GpuSpec
from rlplan.planner.hf_config import architecture_from_hf_config
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.plan import ActorSection, DataSection, ModelSection, Plan, RolloutSection

QWEN25_7B = architecture_from_hf_config(
    {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
    }
)


def make_plan(arch: Architecture = QWEN25_7B, *, gpus: int = 8, gpu_mem_gib: float = 80.0,
              overrides: dict[str, Any] | None = None) -> Plan:
    plan = Plan(
        model=ModelSection(name="test-model", arch=arch),
        cluster=Cluster(gpu=GpuSpec(name="test-gpu", memory_gib=gpu_mem_gib), gpus_per_node=min(gpus, 8),
                        nodes=max(1, gpus // 8)),
        data=DataSection(train_batch_size=64, max_prompt_length=512, max_response_length=1024),
        actor=ActorSection(ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=2),
        rollout=RolloutSection(n=4, log_prob_micro_batch_size_per_gpu=4, max_model_len=1536),
    )
    return apply_knobs(plan, overrides) if overrides else plan


def without_inferred_range(plan: Plan) -> Plan:
    """The plan without the range of verl releases an import inferred (stack.verl_oldest): evidence about the
    script, not what verl runs, so a render's round trip compares without it (the render writes the keys of the
    plan's verl, whose range starts where those keys do)."""
    return plan.evolve(stack=attrs.evolve(plan.stack, verl_oldest=None))
