#!/usr/bin/env bash
# Item 1: the verl command behind `ray job submit ... --`.
ray job submit --address="http://127.0.0.1:8265" \
    --runtime-env-json='{"working_dir": "."}' \
    --no-wait \
    -- python3 -m verl.trainer.main_ppo \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct
