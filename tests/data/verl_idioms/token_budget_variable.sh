#!/usr/bin/env bash
# A token budget in a variable named like a credential's ending (`max_token`): a count, read as the script sets it.
set -euo pipefail
max_token=12288
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    data.train_batch_size=64 \
    data.max_prompt_length=1024 \
    data.max_response_length=2048 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${max_token} \
    actor_rollout_ref.rollout.max_num_batched_tokens=${max_token} \
    trainer.n_gpus_per_node=8
