#!/usr/bin/env bash
# Row 3: command output that reaches only an experiment name and a log folder.
MODEL_PATH=Qwen/Qwen2.5-0.5B-Instruct
NOW=$(date +%Y%m%d)
EXPERIMENT="grpo_$(basename $MODEL_PATH)_${NOW}"

python3 -m verl.trainer.main_ppo \
    actor_rollout_ref.model.path=$MODEL_PATH \
    trainer.experiment_name="$EXPERIMENT" \
    trainer.default_local_dir=/checkpoints/$EXPERIMENT 2>&1 | tee "logs/${EXPERIMENT}.log"
