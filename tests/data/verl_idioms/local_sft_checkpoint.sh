#!/usr/bin/env bash
# Row 7: a model that is no preset: a local SFT checkpoint in verl's layout (global_step_N/actor/huggingface).
python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=./models/sft/global_step_105
