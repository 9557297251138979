#!/usr/bin/env bash
# Row 1: the project folder from $(pwd), the example's own Hydra config under it.
set -xeuo pipefail
PROJECT_DIR="$(pwd)"
CONFIG_PATH="$PROJECT_DIR/examples/demo/config"

python3 -m verl.trainer.main_ppo \
    --config-path="$CONFIG_PATH" \
    --config-name='demo_grpo' \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 "$@"
