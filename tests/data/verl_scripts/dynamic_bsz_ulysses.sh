#!/usr/bin/env bash
# Long-context GRPO with dynamic batch size and Ulysses sequence parallelism (sp 4) on one node.
# The token budget per GPU (4096 x sp 4 = 16384) must hold one whole 17408-token sequence: it does not.
set -euo pipefail
SP=4
MAX_TOKENS=4096
python3 -u -m verl.trainer.main_ppo --config-name=ppo_trainer \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=32 \
    data.max_prompt_length=1024 \
    data.max_response_length=16384 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${MAX_TOKENS} \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=$SP \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.max_model_len=17408 \
    +actor_rollout_ref.model.override_config.attention_dropout=0. \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1
