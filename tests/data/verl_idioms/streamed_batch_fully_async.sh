#!/usr/bin/env bash
# A streamed batch (verl's fully async recipe): data.train_batch_size=0 and one prompt at a time to the rollouter;
# the trainer takes require_batches mini batches per step. The rollout has one node of its own.
mini=16
python3 -m recipe.fully_async_policy.fully_async_main \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=0 \
    data.gen_batch_size=1 \
    data.max_prompt_length=1024 \
    data.max_response_length=2048 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.actor.ppo_mini_batch_size=${mini} \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.free_cache_engine=False \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=4 \
    rollout.nnodes=1 \
    rollout.n_gpus_per_node=4 \
    async_training.require_batches=4 \
    async_training.trigger_parameter_sync_step=2
