#!/usr/bin/env bash
# A rollout on GPUs of its own (verl's one-step-off recipe): the trainer's GPUs and the rollout's split one node,
# the engine never sleeps.
GPUS=${GPUS:-8}
ROLLOUT_GPUS=2
python3 -m recipe.one_step_off_policy.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=96 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.actor.ppo_mini_batch_size=48 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.free_cache_engine=False \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=$((GPUS - ROLLOUT_GPUS)) \
    rollout.nnodes=1 \
    rollout.n_gpus_per_node=${ROLLOUT_GPUS}
