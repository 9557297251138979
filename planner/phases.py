"""The shared vocabulary of one RL step: its phases and how weights reach the rollout engine.

StrEnums, as torchtitan's MeshAxisName: each member is its string, so TOML, JSON, metrics keys and
older callers that pass plain strings read and compare unchanged, while new code names them once.

Glossary (one name per concept, planner and runtime alike):

- **step**: one RL iteration: every phase below once, in order, ending in one optimizer update per
  trained role (`trainer.total_training_steps` counts them). Not a *training step* inside a phase.
- **phase** (`Phase`): a part of the step that runs on the GPUs and is priced: its own memory peak
  (planner.memory), its seconds (planner.steptime) and its metrics keys (`time/<phase>`,
  `memory/<phase>_gib`). The controller's work between phases (`ControllerWork`: reward, advantages)
  is timed but never priced: it holds no GPU memory.
- **pass**: a phase in which a trainer runs its model over the batch in micro batches (the two updates and
  the three log-prob/value forwards); `PASS_KNOBS` holds each pass's batching keys.
- **role**: a model verl builds: the actor (policy), the reference, the critic; a role that trains (actor,
  critic) is a `TrainedRole` (planner.memory.backend). A role's work in a phase is a pass, named by its phase
  (`Phase.OLD_LOG_PROB` is the actor's no_grad forward); `layout.RoleBatchLayout.role` holds that pass's
  `Phase` (the name is older than this glossary).
- **moment** (of a pass): where inside one training pass its memory peak is reached: the planner's update
  sub-phases `loss`, `backward`, `optimizer_step` (memory.report `PhaseMemory.peak_at`), which `rlplan measure`
  calls `MeasuredStage` forward, loss, backward, optimizer; `optimizer_step` and `optimizer` are one moment
  (the AdamW step).
- **rule stage** (planner.rules `Stage`): where verl would refuse a plan (config, worker, runtime, rlplan,
  platform): a property of a rule, not of the step.
- **measured stage** (runtime.emulation `MeasuredStage`): the moment inside one training step that
  `rlplan measure` emulates, where its memory peak was reached (above).
- **pipeline stage**: one pipeline-parallel rank's layers under Megatron (`num_layers_in_first_pipeline_stage`,
  `memory.megatron.stage_activations`); always said in full, never "stage" alone.
- **start-up stage**: what `rlplan run`'s spinner names before the first step (runtime/progress.py).
- **sequence split**: the ranks one sequence is split over: Ulysses sequence parallelism under FSDP, context
  parallelism (CP) under Megatron; `layout.ParallelLayout.ulysses_sequence_parallel_size` holds whichever the
  plan's backend uses (`layout._sequence_and_model_parallel`).
- **sync mode** (`SyncMode`): what the trainer sends the rollout engine in the weight_sync phase.
- **placement** / **pool**: where the rollout engine runs. Colocated (the default, verl's hybrid engine): on the
  trainer's GPUs, every phase on the same GPU. Split (`plan.RolloutPool`, verl's one-step-off and fully async
  recipes): on a pool of GPUs of its own; the rollout phase then runs on a *rollout GPU*, the weight sync and the
  passes on a *trainer GPU* (`memory.report.PhaseMemory.pool`), and generation overlaps training.
"""

from __future__ import annotations

from enum import StrEnum

from attrs import frozen


class Phase(StrEnum):
    """The phases of one colocated step in the order they run (memory, step time, metrics and charts key on them)."""

    WEIGHT_SYNC = "weight_sync"  # trainer weights pushed into the waking engine
    ROLLOUT = "rollout"  # generation
    OLD_LOG_PROB = "old_log_prob"  # actor forward, no_grad
    REF_LOG_PROB = "ref_log_prob"  # reference forward, only with a KL term
    CRITIC_VALUES = "critic_values"  # critic forward, PPO/GAE only
    CRITIC_UPDATE = "critic_update"  # critic training step
    ACTOR_UPDATE = "actor_update"  # actor training step


class ControllerWork(StrEnum):
    """The controller's work between the phases: timed (`time/<name>`), never priced (no GPU memory)."""

    REWARD = "reward"  # scores of the rollouts, by data source
    ADVANTAGES = "advantages"  # GRPO / RLOO / REINFORCE++ on the controller, GAE from the critic's values


class SyncMode(StrEnum):
    """What the trainer sends the rollout engine after an update."""

    ADAPTER = "adapter"  # LoRA tensors only; the engine keeps its base
    BASE = "base"  # the frozen base weights, LoRA excluded (a LoRA run's first sync or a resume)
    MERGED = "merged"  # full weights with any adapter folded in


@frozen
class PassKnobs:
    """A trainer pass's batching knobs, as plan keys: the solver's passes and the rule on verl's deprecated
    global micro-batch keys read PASS_KNOBS; the budget rules, the diagnosis and the runtime's batching
    read TOKEN_BUDGET_KEY, derived from it."""

    # Switches the pass between a token budget and fixed micro batches.
    dynamic_bsz: str
    # Caps the pass's tokens per GPU per micro batch under dynamic batch sizes.
    token_budget: str
    # Sequences per GPU per micro batch otherwise.
    micro_batch: str
    # verl's older global micro batch (divided by the data-parallel size); verl rejects it beside the per-GPU
    # key, so setting `micro_batch` clears it. None where verl has no such key.
    legacy_micro_batch: str | None


PASS_KNOBS: dict[Phase, PassKnobs] = {
    Phase.ACTOR_UPDATE: PassKnobs(dynamic_bsz="actor.use_dynamic_bsz", token_budget="actor.ppo_max_token_len_per_gpu",
                                  micro_batch="actor.ppo_micro_batch_size_per_gpu",
                                  legacy_micro_batch="actor.ppo_micro_batch_size"),
    Phase.OLD_LOG_PROB: PassKnobs(dynamic_bsz="rollout.log_prob_use_dynamic_bsz",
                                  token_budget="rollout.log_prob_max_token_len_per_gpu",
                                  micro_batch="rollout.log_prob_micro_batch_size_per_gpu",
                                  legacy_micro_batch="rollout.log_prob_micro_batch_size"),
    Phase.REF_LOG_PROB: PassKnobs(dynamic_bsz="ref.log_prob_use_dynamic_bsz",
                                  token_budget="ref.log_prob_max_token_len_per_gpu",
                                  micro_batch="ref.log_prob_micro_batch_size_per_gpu",
                                  legacy_micro_batch="ref.log_prob_micro_batch_size"),
    Phase.CRITIC_UPDATE: PassKnobs(dynamic_bsz="critic.use_dynamic_bsz", token_budget="critic.ppo_max_token_len_per_gpu",
                                   micro_batch="critic.ppo_micro_batch_size_per_gpu",
                                   legacy_micro_batch="critic.ppo_micro_batch_size"),
    Phase.CRITIC_VALUES: PassKnobs(dynamic_bsz="critic.use_dynamic_bsz",
                                   token_budget="critic.forward_max_token_len_per_gpu",
                                   micro_batch="critic.forward_micro_batch_size_per_gpu", legacy_micro_batch=None),
}

# The plan key that caps each trainer pass's tokens per GPU under dynamic batch sizes.
TOKEN_BUDGET_KEY: dict[Phase, str] = {phase: knobs.token_budget for phase, knobs in PASS_KNOBS.items()}
