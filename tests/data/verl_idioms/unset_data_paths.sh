#!/usr/bin/env bash
# Row 4: variables the script never sets, reaching only data and checkpoint paths (and the model's folder,
# whose name is a preset's).
TRAIN_FILE=${TRAIN_FILE:-$DATA_HOME/gsm8k/train.parquet}

python3 -m verl.trainer.main_ppo \
    data.train_files="$TRAIN_FILE" \
    data.val_files=$DATA_HOME/gsm8k/test.parquet \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path=${RAY_DATA_HOME}/models/Qwen2.5-0.5B-Instruct \
    trainer.default_local_dir=$DIST_CKPT_PATH/grpo
