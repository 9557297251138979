#!/usr/bin/env bash
# A model path shipped as a stand-in for the user's own, behind a variable with a default.
set -xeuo pipefail
MODEL=${MODEL:-"/PUT_YOUR_MODEL_HERE/"}
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path="${MODEL}" \
    data.train_batch_size=32 \
    trainer.n_gpus_per_node=8
