"""rlplan's CPU runtime: what a rank's or the engine's resident set holds beside the tensors a phase prices.

On a CPU cluster (rlplan's own runtime) a phase's figure is the resident set (RSS) of the process that runs it,
its peak the kernel's VmHWM mark (runtime/metrics.py, which records the file-backed part apart). Issue 42 measured
what it is made of (`rlplan run` records `memory/<phase>_mapped_gib`, the RssFile + RssShmem part):

- a per-machine baseline: the interpreter, torch, transformers, Ray's core worker, gloo, and the pages of the
  shared libraries the process touched (~0.22 GiB of a trainer's, ~0.26 of the engine's on the 2-core AVX2
  EPYC), which follow the ISA's code paths and the page cache; it does not scale with the model.
  `rlplan calibrate --cpu` measures it on the user's machine (runtime/calibrate.py, `measure_cpu_baselines`);
  unmeasured, the profile's built-in bounds stand in, an assumption for a CPU nobody measured.
- the heap beyond the priced tensors, which scales with the model: glibc keeps what torch frees (its dynamic
  mmap threshold moves large blocks into arenas it does not give back), so after the first step every trainer
  phase holds the step's high-water mark: FSDP2's gathered full parameters and unsharded gradients, AdamW's
  foreach temporaries, the weight sync's full copy of the model (built on every rank, runtime/weights.py
  iter_hf_weights) and rank 0's copy in Ray's object store (shared memory pages that stay mapped). The engine
  holds the received copy, unpickled from the object store, beside its loaded weights.

The trainer's heap is priced as: every trainer phase holds the step's largest trainer phase (glibc's high-water
mark), plus copies of the model (`profile.cpu_trainer_heap_model_copies`) and a fraction of that phase's priced
bytes (`cpu_trainer_heap_fragmentation`); the engine's as copies of the synced weights
(`cpu_engine_sync_model_copies`). Their fit, before/after and the held-out check: docs/charts.md (the demo's
report), tests/runtime/test_demo.py.
"""

from __future__ import annotations

from attrs import frozen

from rlplan.planner.memory.fsdp import DTYPE_BYTES
from rlplan.planner.memory.model_facts import model_facts
from rlplan.planner.memory.report import GIB, Component
from rlplan.planner.plan import Plan
from rlplan.planner.profile import Profile


@frozen
class CpuBaselines:
    """The per-machine part of a CPU trainer rank's and the engine's RSS, and where it came from."""

    trainer_bytes: int
    engine_bytes: int
    measured: bool

    @property
    def source(self) -> str:
        if self.measured:
            return "measured on this machine (`rlplan calibrate --cpu`)"
        return ("the built-in bound (an assumption for a CPU no `rlplan calibrate --cpu` measured: the highest "
                "baseline seen on the CPUs with evidence)")

    def describe(self) -> str:
        return (f"CPU process baselines {self.trainer_bytes / GIB:.2f} GiB per trainer rank, "
                f"{self.engine_bytes / GIB:.2f} GiB for the engine: {self.source}")


def cpu_baselines(profile: Profile) -> CpuBaselines:
    """The measured baselines where `calibrate --cpu` wrote both into the profile, else the built-in bounds."""
    trainer, engine = profile.cpu_trainer_baseline_measured_gib, profile.cpu_rollout_baseline_measured_gib
    if trainer > 0 and engine > 0:
        return CpuBaselines(int(trainer * GIB), int(engine * GIB), measured=True)
    return CpuBaselines(int(profile.cpu_trainer_process_gib * GIB), int(profile.cpu_rollout_process_gib * GIB),
                        measured=False)


def model_copy_bytes(plan: Plan) -> int:
    """One full copy of the policy in the trainer's dtype (FSDP's model_dtype): the unit the heap terms count."""
    return DTYPE_BYTES[plan.actor.model_dtype] * model_facts(plan.model.arch).params


def trainer_heap_component(plan: Plan, profile: Profile, *, high_water: int, own: int) -> Component:
    """What a trainer rank's heap holds beyond a phase's priced tensors (module docstring), given the step's
    largest trainer phase's priced bytes (`high_water`) and this phase's (`own`), both without the baseline:
    the copies of the model; what the largest phase priced beyond this one (glibc does not give that phase's
    high-water mark back, so every trainer phase after the first step holds it); and the fragmentation of the
    arenas, a fraction of the high-water mark."""
    copies = profile.cpu_trainer_heap_model_copies * model_copy_bytes(plan)
    kept = max(0, high_water - own) + profile.cpu_trainer_heap_fragmentation * high_water
    return Component("cpu_heap_high_water", int(copies + kept), "overhead")


def engine_sync_component(plan: Plan, profile: Profile) -> Component:
    """The weight sync's copy of the model in the engine's process (the object store's pages and the unpickled
    tensors), in the engine's dtype; none when only a LoRA adapter travels."""
    if plan.model.lora.rank:
        return Component("cpu_engine_received_weights", 0, "overhead")
    payload = plan.rollout.dtype_bytes * model_facts(plan.model.arch).params
    return Component("cpu_engine_received_weights", int(profile.cpu_engine_sync_model_copies * payload), "overhead")
