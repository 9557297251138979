"""One verl step's wall time, per phase, at the workload's real lengths: what the solver ranks plans by.

Not a simulator, but each phase is priced the way verl runs it (docs/steptime.md has the model, its
constants and how far it is from published runs):

* Lengths.  Every phase runs at the data's mean lengths (`data.expected_*_length`, else the lengths a
  calibrated profile observed, else `profile.unstated_length_fraction` of the maxima), and responses
  follow a log-normal of that mean and `profile.response_length_sigma`, cut at max_response_length.
* Rollout.  Each engine decodes its share of the generation batch (`data.gen_batch_size` prompts where a
  DAPO-style recipe sets it) at the concurrency its KV cache holds at those lengths.  A decode step costs
  the longer of the GPU's roofline (weights + every running sequence's KV from HBM, TP all-reduces) and
  the engine's host work (a floor per layer, lower with CUDA graphs than eager, and a cost per running
  sequence: scheduling, sampling, detokenizing).  The batch ends with its longest responses: once the
  queue is empty the running sequences drain along the length distribution at ever smaller batches.
* Trainer passes, through the plan's training backend (steptime.backend: FSDP in steptime.fsdp, Megatron
  in steptime.megatron).  Tokens really processed (mean lengths with remove padding, the maximum without)
  at the GPU's peak FLOP/s x the MFU its class reaches, plus a fixed cost per micro batch and layer; FSDP's
  collectives bound each micro batch; Megatron's split the compute over TP x PP and add TP's per-layer
  collectives, the pipeline bubble, expert parallelism's all-to-alls and context parallelism's ring.  The old-log-prob pass also computes the entropy over the
  vocabulary; the reference pass does not (with LoRA it is the actor with its adapter disabled).
* Offload, weight sync and sleep/wake: PCIe and collective traffic as before.

The public entry point is `predict_step_time(plan, memory, profile, layout) -> StepTime`, per-phase
seconds keyed by `Phase` names plus "offload".  The package exports it and the names other modules read;
everything else is imported from the module that owns it: lengths, rates, rollout, passes (what every
backend's passes share), backend (the boundary), fsdp, megatron, step.
"""

from __future__ import annotations

from rlplan.planner.steptime.lengths import Lengths, workload_lengths
from rlplan.planner.steptime.rates import training_mfu_key
from rlplan.planner.steptime.rollout import rollout_concurrency
from rlplan.planner.steptime.step import StepTime, predict_step_time, verl_timing_seconds

__all__ = [
    "Lengths",
    "StepTime",
    "predict_step_time",
    "rollout_concurrency",
    "training_mfu_key",
    "verl_timing_seconds",
    "workload_lengths",
]
