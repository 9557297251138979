"""What `rlplan calibrate` measures: a profile's constants on a GPU, fitted from a finished run, or this CPU's rates.

With a plan, on a machine with a CUDA GPU, the plan's actor update runs for real on
one GPU: the same HF model and FSDP2 wrap as `rlplan measure`, over a fake process
group of the plan's shard size, so every tensor has its true per-rank size while the
collectives cost nothing.  What the GPU held at the peak (context, NCCL, reserved
memory) against the planner's allocated bytes fits the context budget and the
fragmentation fraction; the step's seconds against its FLOPs give the achieved MFU.

With `--from-run`, the observations come from a run's metrics.jsonl and the plan
beside it (or the plan given).  The fitting itself is `rlplan.planner.calibration`; the command (reading,
writing the profile, printing, exit codes) is runtime/commands.py's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from rlplan.planner.calibration import (
    Calibration,
    MemoryObservation,
    TimeObservation,
    calibrate,
    memory_observation,
    observations_from_metrics,
    observed_lengths,
)
from rlplan.planner.errors import PlanError
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE

GPU_ITERATIONS = 3  # the first warms up kernels and creates AdamW's state; the others are timed


def measure_cpu_rates(size: int = 1024, copy_mib: int = 256, repeats: int = 5) -> tuple[float, float, float]:
    """(TFLOP/s of a square fp32 matmul, the same in bf16, GB/s of a large tensor copy), best of `repeats`, on all
    this process's cores.

    The trainer's passes and the engine's prefill are GEMMs in their compute dtype, and the decode reads
    weights and KV from memory: these figures are the roofline's compute and bandwidth on this machine. The
    bf16 figure decides whether a CPU plan computes in bf16 (native on AVX512-BF16 / AMX, emulated elsewhere).
    """
    import torch

    from rlplan.runtime.platform import available_cores

    previous = torch.get_num_threads()
    torch.set_num_threads(available_cores())
    try:
        a = torch.randn(size, size)
        b = torch.randn(size, size)
        torch.mm(a, b)  # warm-up: thread pool and kernels
        best_mm = min(_seconds(lambda: torch.mm(a, b)) for _ in range(repeats))
        a16, b16 = a.bfloat16(), b.bfloat16()
        torch.mm(a16, b16)
        best_mm16 = min(_seconds(lambda: torch.mm(a16, b16)) for _ in range(repeats))
        source = torch.empty(copy_mib * 2**20 // 4)
        target = torch.empty_like(source)
        target.copy_(source)
        best_copy = min(_seconds(lambda: target.copy_(source)) for _ in range(repeats))
    finally:
        torch.set_num_threads(previous)
    # A copy reads and writes every byte.
    return 2.0 * size**3 / best_mm / 1e12, 2.0 * size**3 / best_mm16 / 1e12, 2.0 * source.numel() * 4 / best_copy / 1e9


def _seconds(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def calibrate_from_run(plan: Plan, rows: list[dict[str, Any]], name: str = "calibrated") -> Calibration:
    memory, times, notes = observations_from_metrics(plan, rows)
    lengths = observed_lengths(rows)
    if not memory and not times and lengths is None:
        raise PlanError(field="--from-run", message="the run's metrics hold no phase times, held-memory peaks or "
                        "sequence lengths.",
                        fix="point --from-run at the metrics.jsonl of a run that finished at least two steps")
    if lengths is not None:
        notes.append(f"the run's sequences averaged {lengths.prompt_mean:.1f} prompt + {lengths.response_mean:.1f} "
                     "response tokens; solve/validate --profile price fixed micro batches at these means when a plan "
                     "sets no data.expected_*_length")
    result = calibrate(memory, times, name=name, lengths=lengths)
    return attrs.evolve(result, notes=tuple(notes) + result.notes)


def calibrate_on_gpu(plan: Plan, name: str = "calibrated") -> Calibration:
    import torch

    if not torch.cuda.is_available():
        raise PlanError(field="calibrate", message="no CUDA GPU is visible, and calibrating memory and MFU needs one.",
                        fix="run `rlplan calibrate plan.toml` on a GPU machine, or fit from a finished run "
                            "with `--from-run runs/x/metrics.jsonl`")
    from rlplan.runtime.measure import plan_as_measured

    # The head verl runs for the plan (its twin on this GPU), priced the same way; a compiled entropy as eager.
    plan = plan_as_measured(plan, "auto")
    held_bytes, seconds, flops = _real_update_step(plan)
    memory: list[MemoryObservation] = [memory_observation(plan, Phase.ACTOR_UPDATE, held_bytes)]
    mfu = DEFAULT_PROFILE.training_mfu
    peak_flops = plan.cluster.gpu.bf16_tflops * 1e12
    times = [TimeObservation(phase=Phase.ACTOR_UPDATE, efficiency="training_mfu", assumed=mfu,
                             predicted_seconds=flops / (mfu * peak_flops), measured_seconds=seconds)]
    return calibrate(memory, times, name=name)


def _real_update_step(plan: Plan) -> tuple[float, float, float]:
    """(GPU bytes held at the peak, seconds per optimizer step, FLOPs per optimizer step) on this GPU."""
    import torch

    from rlplan.planner.memory.model_facts import model_facts
    from rlplan.runtime.emulation import default_dtype, faithful_emulation, fake_process_group
    from rlplan.runtime.measure import training_step_of_plan
    from rlplan.runtime.measured_step import (
        base_dtype,
        build_sharded_model,
        make_inputs,
        make_optimizer,
        update_iteration,
    )

    step = training_step_of_plan(plan, Phase.ACTOR_UPDATE)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    # What the process already holds before the model: CUDA context, cuBLAS and NCCL workspaces.
    baseline = total - free
    with fake_process_group(step.shard_size), faithful_emulation(), default_dtype(base_dtype(step)):
        model = build_sharded_model(step, None, device="cuda")
        optimizer = make_optimizer(model, step)
        input_ids, position_ids = make_inputs(step, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        timed: list[float] = []
        for iteration in range(GPU_ITERATIONS):
            torch.cuda.synchronize()
            started = time.perf_counter()
            update_iteration(model, optimizer, step, input_ids, position_ids, lambda stage: None)
            torch.cuda.synchronize()
            if iteration:
                timed.append(time.perf_counter() - started)
        held = baseline + torch.cuda.max_memory_reserved()
    facts = model_facts(plan.model.arch)
    # Backward is 2x forward, 1x with a frozen base; recompute under checkpointing adds 1x.
    multiplier = (2.0 if step.lora_rank else 3.0) + (1.0 if step.gradient_checkpointing else 0.0)
    tokens = step.tokens_per_micro_batch * step.micro_batches
    flops = tokens * facts.forward_flops_per_token(step.input_shape[1] / 2) * multiplier
    return float(held), sum(timed) / len(timed), flops


# The run `measure_cpu_baselines` makes: the bundled tiny model (its state ~0.01 GiB, so what the process holds
# is nearly all baseline) on a batch unlike the demo's, two steps (the heap's high-water mark comes with the first).
BASELINE_RUN_PROMPTS = 2
BASELINE_RUN_SAMPLES = 8
BASELINE_RUN_STEPS = 2
# What a trainer rank's RSS still creeps after the baseline run's two steps, added to the trainer's baseline:
# the demo's rose from 0.606 GiB at step 2 to 0.618 by step 12 on the 2-core EPYC (issue 42), 0.001 GiB a step;
# the engine's did not move (1.845 from step 2 on).
TRAINER_CREEP_ALLOWANCE_GIB = 0.02


@attrs.frozen
class CpuBaselineMeasurement:
    """What one trainer rank and the engine held on this machine beyond what the planner prices (GiB)."""

    trainer_gib: float
    engine_gib: float
    # The run's peaks per phase and what of each was file-backed (shared libraries, shared memory), GiB.
    peaks_gib: dict[str, float]
    mapped_gib: dict[str, float]


def measure_cpu_baselines(work_dir: str | Path) -> CpuBaselineMeasurement:
    """This machine's CPU process baselines: a short run of the bundled tiny model with the runtime's own trainer
    ranks and engine, each phase's measured RSS less what the planner prices for it without a baseline
    (planner/memory/cpu_process.py); the largest over the trainer's phases (with what a longer run still creeps,
    TRAINER_CREEP_ALLOWANCE_GIB), the rollout's for the engine.

    The shared libraries' resident pages follow the ISA's code paths, so only a process that ran them on this
    CPU says what they take.
    """
    from rlplan.runtime.demo_workload import demo_plan, solve_demo_plan
    from rlplan.runtime.loop import PromptSource, RunOptions, run_loop
    from rlplan.runtime.metrics import predicted_phase_peaks, read_metrics
    from rlplan.runtime.platform import detect_platform
    from rlplan.runtime.tiny import ensure_tiny_model, write_toy_dataset

    out = Path(work_dir)
    model_dir = ensure_tiny_model(out / "model")
    train_file, _ = write_toy_dataset(out / "data" / "train.parquet", BASELINE_RUN_PROMPTS * BASELINE_RUN_STEPS)
    workload = demo_plan(model_dir, train_file, out / "run", steps=BASELINE_RUN_STEPS, algorithm="grpo_full",
                         train_batch_size=BASELINE_RUN_PROMPTS, n=BASELINE_RUN_SAMPLES)
    plan = solve_demo_plan(workload)
    platform = detect_platform()
    summary = run_loop(plan, platform, RunOptions(output_dir=out / "run"), PromptSource.from_plan(plan))
    measured = {row["phase"]: row["measured_gib"] for row in summary.plan_versus_actual if row["measured_gib"]}
    unpriced = attrs.evolve(DEFAULT_PROFILE, cpu_trainer_process_gib=0.0, cpu_rollout_process_gib=0.0,
                            cpu_trainer_baseline_measured_gib=0.0, cpu_rollout_baseline_measured_gib=0.0)
    priced = predicted_phase_peaks(plan, unpriced)
    residual = {phase: measured[phase] - priced[phase] for phase in measured if phase in priced}
    trainer = [value for phase, value in residual.items() if phase != Phase.ROLLOUT]
    if not trainer or Phase.ROLLOUT not in residual:
        raise PlanError(field="calibrate --cpu", message="the baseline run measured no trainer or rollout phase.",
                        fix="run `rlplan demo` to see why the runtime does not run on this machine")
    mapped: dict[str, float] = {}
    for record in read_metrics(out / "run"):
        for key, value in record.items():
            if key.startswith("memory/") and key.endswith("_mapped_gib"):
                phase = key[len("memory/"):-len("_mapped_gib")]
                mapped[phase] = max(mapped.get(phase, 0.0), float(value))
    return CpuBaselineMeasurement(trainer_gib=_up(max(trainer) + TRAINER_CREEP_ALLOWANCE_GIB),
                                  engine_gib=_up(residual[Phase.ROLLOUT]),
                                  peaks_gib=measured, mapped_gib=mapped)


def _up(gib: float) -> float:
    """Rounded up to 0.01 GiB, never below it (a baseline of 0 would read as 'not measured')."""
    return max(0.01, math.ceil(gib * 100) / 100)
