"""From a plan's rollout knobs to vLLM engine arguments: pure, so every mapping is unit-testable.

Knobs the platform cannot honour are refused before the engine is built, by `rlplan run`'s
`check_plan(plan, platform)` (planner/rules.py); none is dropped silently. The only platform fact
needed here is whether vLLM runs on a GPU.
"""

from __future__ import annotations

from typing import Any

from rlplan.planner.errors import PlanError
from rlplan.planner.memory.rollout import rollout_max_model_len
from rlplan.planner.plan import Plan
from rlplan.planner.rules import VLLM_LORA_RANKS


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise PlanError(
        field="model.lora.rank",
        message=f"vLLM serves LoRA adapters up to rank {VLLM_LORA_RANKS[-1]}, the plan asks for {rank}.",
        fix=f"set model.lora.rank to at most {VLLM_LORA_RANKS[-1]}",
    )




def vllm_engine_kwargs(
    plan: Plan, model_dir: str, *, on_gpu: bool = False, seed: int = 0, lora_rank: int = 0
) -> dict[str, Any]:
    """Arguments for `vllm.LLM(**kwargs)` that realise the plan's rollout section.

    lora_rank 0 takes the plan's model.lora.rank.
    """
    rollout = plan.rollout
    rank = lora_rank or plan.model.lora.rank
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "tokenizer": model_dir,
        "dtype": rollout.dtype,
        "seed": seed,
        "tensor_parallel_size": rollout.tensor_model_parallel_size,
        "max_num_seqs": rollout.max_num_seqs,
        "max_num_batched_tokens": rollout.max_num_batched_tokens,
        "max_model_len": rollout_max_model_len(plan),
        "enable_chunked_prefill": rollout.enable_chunked_prefill,
        "enable_prefix_caching": rollout.enable_prefix_caching,
        "enforce_eager": rollout.enforce_eager,
        "load_format": rollout.load_format,
        # Log-probs after temperature scaling: what the trainer recomputes from logits / temperature.
        "logprobs_mode": "processed_logprobs",
    }
    if rollout.tensor_model_parallel_size > 1:
        # One worker process per TP rank beside the engine core (on CPU they talk through shared memory).
        kwargs["distributed_executor_backend"] = "mp"
    if on_gpu:
        kwargs["gpu_memory_utilization"] = rollout.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = rollout.free_cache_engine
    if rank > 0:
        kwargs["enable_lora"] = True
        kwargs["max_lora_rank"] = vllm_lora_rank(rank)
        # One adapter is live at a time: the policy being trained.
        kwargs["max_loras"] = 1
    return kwargs
