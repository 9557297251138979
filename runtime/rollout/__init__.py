"""The rollout side: a vLLM engine that samples the policy and takes the trainer's weights."""

from rlplan.runtime.rollout.engine import GeneratedSample, VllmRollout
from rlplan.runtime.rollout.engine_args import vllm_engine_kwargs, vllm_lora_rank

__all__ = ["GeneratedSample", "VllmRollout", "vllm_engine_kwargs", "vllm_lora_rank"]
