#!/usr/bin/env bash
# Item 1: the script's folder two ways, $((...)), ${VAR:=x}, export.
SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
HERE=$(dirname "$0")
export NNODES=${NNODES:=1}
GPUS=$(( 4 * 2 ))
PROMPTS=$(( 16 * GPUS / 2 ))

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=$PROMPTS \
    data.train_files=$SCRIPT_DIR/data/train.parquet \
    data.val_files=$HERE/data/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=$(( PROMPTS / 2 )) \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    trainer.nnodes=$NNODES \
    trainer.n_gpus_per_node=$GPUS
