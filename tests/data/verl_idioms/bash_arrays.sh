#!/usr/bin/env bash
# Row 5: overrides kept in bash arrays over many lines (with comments), extended with +=, expanded "${A[@]}".
DATA=(
    data.train_batch_size=64   # prompts per step
    data.max_prompt_length=512
    # a comment line inside the array, with a quote: don't
    data.max_response_length=1024
)
ACTOR=(
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct
    actor_rollout_ref.actor.ppo_mini_batch_size=32
)
ACTOR+=(actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4")
ROLLOUT=(actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4)

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    "${DATA[@]}" \
    "${ACTOR[@]}" \
    "${ROLLOUT[@]}" \
    trainer.n_gpus_per_node=8
