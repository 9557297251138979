"""From a plan's rollout knobs to vLLM engine arguments: pure, so every mapping is unit-testable.

Knobs the platform cannot honour raise a PlanError naming the field and the fix; none is
dropped silently. The only platform fact needed is whether vLLM runs on a GPU.
"""

from __future__ import annotations

from typing import Any

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import Plan

# vLLM's LoraConfig.max_lora_rank accepts only these (vllm.config.lora.MaxLoRARanks); its import
# path moves between vLLM versions, so the set is kept here.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

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


def rollout_max_model_len(plan: Plan) -> int:
    """The context vLLM reserves per sequence: the plan's value, else prompt + response."""
    return plan.rollout.max_model_len or plan.data.max_sequence_length


def check_rollout_platform(plan: Plan, *, on_gpu: bool, lora_rank: int) -> None:
    """Raise for rollout knobs this platform cannot honour."""
    rollout = plan.rollout
    if on_gpu and rollout.free_cache_engine and lora_rank > 0 and rollout.sleep_level == 2:
        raise PlanError(
            field="rollout.sleep_level",
            message=(
                "is 2 with LoRA: level 2 discards vLLM's base weights on sleep, and an adapter sync does not "
                "resend them, so generation after wake-up would run on garbage weights."
            ),
            fix="set rollout.sleep_level = 1 when model.lora.rank > 0",
        )
    max_model_len = rollout_max_model_len(plan)
    if not rollout.enable_chunked_prefill and rollout.max_num_batched_tokens < max_model_len:
        raise PlanError(
            field="rollout.max_num_batched_tokens",
            message=(
                f"is {rollout.max_num_batched_tokens}, below max_model_len {max_model_len}: without chunked "
                "prefill vLLM must prefill a whole prompt in one batch."
            ),
            fix=f"set rollout.max_num_batched_tokens >= {max_model_len} or rollout.enable_chunked_prefill = true",
        )
    if max_model_len > plan.model.arch.max_position_embeddings:
        raise PlanError(
            field="rollout.max_model_len",
            message=(
                f"{max_model_len} tokens exceed the model's max_position_embeddings "
                f"({plan.model.arch.max_position_embeddings})."
            ),
            fix="lower data.max_prompt_length + data.max_response_length, or set rollout.max_model_len",
        )


def vllm_engine_kwargs(
    plan: Plan, model_dir: str, *, on_gpu: bool = False, seed: int = 0, lora_rank: int = 0
) -> dict[str, Any]:
    """Arguments for `vllm.LLM(**kwargs)` that realise the plan's rollout section.

    lora_rank 0 takes the plan's model.lora.rank. Raises PlanError for knobs the platform
    cannot honour (see `check_rollout_platform`).
    """
    rollout = plan.rollout
    rank = lora_rank or plan.model.lora.rank
    check_rollout_platform(plan, on_gpu=on_gpu, lora_rank=rank)
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
