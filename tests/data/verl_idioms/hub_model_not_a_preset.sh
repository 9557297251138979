#!/usr/bin/env bash
# Row 7: a model that is no preset: a hub repo id, read offline from the local Hugging Face cache.
python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=example-org/tiny-llama-sft
