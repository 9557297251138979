#!/usr/bin/env bash
# The script leaves its model variable empty for the user to fill in.
BASE_MODEL=""
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=$BASE_MODEL \
    data.train_batch_size=32 \
    trainer.n_gpus_per_node=8
