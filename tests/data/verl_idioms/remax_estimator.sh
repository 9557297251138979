#!/usr/bin/env bash
# Row 6: an estimator that changes the step: ReMax generates a greedy baseline per batch.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=remax \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.rollout.n=4
