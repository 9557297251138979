#!/usr/bin/env bash
# Item 1: rlplan runs nothing. Every command substitution here would create a file if it ran.
MARK=${MARK_DIR:-/tmp/rlplan-never}/ran
STAMP=$(touch "$MARK.assign")
LEGACY=`touch "$MARK.backquote"`
if [ "$(touch "$MARK.condition")" = "" ]; then
    BRANCH=$(touch "$MARK.branch")
fi
eval "$(touch "$MARK.eval")"
python3 -m verl.trainer.main_ppo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    trainer.experiment_name="run_$(touch "$MARK.command")"
