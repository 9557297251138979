#!/usr/bin/env bash
# Item 1: a backslash, a space and a comment end the line as bash reads it: the escaped space is an
# argument of its own (which Hydra refuses) and the lines after it are another command.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \  # the model
    data.train_batch_size=64 \
    trainer.n_gpus_per_node=8
