#!/usr/bin/env bash
# verl's SPIN recipe (online DPO against a reference), its config named on the command line; the deprecated
# global micro batch sizes as verl's own SPIN script writes them.
python3 -m recipe.spin.main_spin --config-path=config --config-name=spin_trainer \
    data.train_batch_size=64 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size=8 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size=16 \
    trainer.n_gpus_per_node=4 \
    trainer.nnodes=1 \
    trainer.ref_update_freq=1
