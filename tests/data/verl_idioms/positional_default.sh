#!/usr/bin/env bash
# Row 2: the engine from the script's first argument, vllm when it is run with none.
ENGINE=${1:-vllm}
shift || true

python3 -m verl.trainer.main_ppo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.rollout.name=$ENGINE "$@"
