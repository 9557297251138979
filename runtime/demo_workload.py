"""The demo's workload: the bundled tiny model and toy task as a Plan (`demo_plan`), this CPU machine as its
cluster, and its knobs solved for the machine (`solve_demo_plan`).

`rlplan demo` runs it (runtime/commands.py), `rlplan calibrate --cpu` measures this machine's process baselines on
it (runtime/calibrate.py), and the benchmarks and tests build their CPU plans from it; it lives apart from the
commands layer so that calibrate, which the commands call, needs nothing of that layer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from rlplan.planner.commands.this_machine import cpu_cluster
from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster
from rlplan.planner.hf_config import architecture_from_hf_config
from rlplan.planner.plan import (
    ActorSection,
    AlgorithmSection,
    CriticSection,
    DataSection,
    LoraConfig,
    ModelSection,
    Plan,
    RefSection,
    RewardSection,
    RolloutSection,
    TrainerSection,
)
from rlplan.planner.platform import CPU_RUNTIME_PINS

DemoAlgorithm = Literal["grpo", "grpo_full", "ppo"]


DEMO_HOST_MEMORY_GIB = 16.0


def demo_cluster(world_size: int, host_memory_gib: float = DEMO_HOST_MEMORY_GIB) -> Cluster:
    """This CPU machine as `world_size` one-process trainer ranks sharing its cores (measured or estimated
    rates, as `rlplan solve --device cpu` prices them)."""
    cluster, _ = cpu_cluster(world_size, host_memory_gib)
    return cluster


def demo_plan(
    model_dir: str | Path,
    train_file: str | Path,
    output_dir: str | Path,
    *,
    steps: int,
    algorithm: DemoAlgorithm = "grpo",
    world_size: int = 2,
    train_batch_size: int = 8,
    n: int = 8,
    lr: float | None = None,
    save_freq: int = -1,
    seed: int = 1,
) -> Plan:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    lora_rank = 8 if algorithm == "grpo" else 0
    ppo = algorithm == "ppo"
    return Plan(
        model=ModelSection(
            name="rlplan-tiny-qwen2",
            arch=architecture_from_hf_config(config),
            path=str(model_dir),
            lora=LoraConfig(rank=lora_rank, alpha=16, target_modules=("all-linear",)),
            gradient_checkpointing=False,
            use_remove_padding=True,
        ),
        cluster=demo_cluster(world_size),
        data=DataSection(
            train_batch_size=train_batch_size,
            max_prompt_length=48,
            max_response_length=8,
            train_files=(str(train_file),),
            truncation="error",
            seed=seed,
        ),
        actor=ActorSection(
            # Two optimizer steps per RL step: the toy task then learns within a handful of steps.
            ppo_mini_batch_size=max(1, train_batch_size // 2),
            ppo_micro_batch_size_per_gpu=4,
            # LoRA learns with a larger step than full fine-tuning of the same tiny model (verl's LoRA
            # guide: an order of magnitude); 2e-2 overshot, with a quarter of the tokens clipped. Full
            # fine-tuning at 1e-3 collapsed the policy to one answer (entropy 0) by step 6 of the demo;
            # at 3e-4 the reward rose from 0.24 to 0.56 over 12 steps with the entropy still ~0.6.
            lr=lr if lr is not None else (5e-3 if lora_rank else 3e-4),
            weight_decay=0.0,
            grad_clip=1.0,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            use_kl_loss=not ppo,
            kl_loss_coef=0.001,
            kl_loss_type="low_var_kl",
            # The workload computes in fp32 everywhere, so that a run of it is exact on any CPU;
            # solve_demo_plan then picks what this CPU computes fastest in (bf16 where it is native).
            compute_dtype="float32",
        ),
        ref=RefSection(log_prob_micro_batch_size_per_gpu=8, compute_dtype="float32"),
        rollout=RolloutSection(
            n=n,
            gpu_memory_utilization=0.5,
            max_num_seqs=64,
            max_num_batched_tokens=2048,
            max_model_len=64,
            enforce_eager=True,
            free_cache_engine=False,
            load_format="safetensors",
            dtype="float32",
            temperature=1.0,
            log_prob_micro_batch_size_per_gpu=8,
        ),
        critic=CriticSection(
            enable=ppo,
            compute_dtype="float32",
            ppo_micro_batch_size_per_gpu=4,
            forward_micro_batch_size_per_gpu=8,
            gradient_checkpointing=False,
            lr=1e-3,
        ),
        algorithm=AlgorithmSection(adv_estimator="gae" if ppo else "grpo", gamma=1.0, lam=0.95),
        reward=RewardSection(),
        trainer=TrainerSection(
            total_training_steps=steps,
            save_freq=save_freq,
            output_dir=str(output_dir),
            seed=seed,
        ),
    )


# What the CPU runtime cannot do (or does not need) is pinned; `rlplan solve` picks the rest.
DEMO_CPU_PINS = CPU_RUNTIME_PINS


def solve_demo_plan(workload: Plan, pins: dict[str, Any] | None = None) -> Plan:
    """The demo's knobs as `rlplan solve --from` picks them for this machine, keeping the workload (and `pins`)."""
    from rlplan.planner.solver import SolveRequest, solve
    from rlplan.runtime.platform import detect_platform

    # Without a C++ compiler the engine can only start eager (rules: compiled_cpu_rollout_needs_a_compiler).
    machine_pins = {} if detect_platform().supports_compiled_rollout else {"rollout.enforce_eager": True}

    if workload.algorithm.adv_estimator is None:
        raise PlanError(field="algorithm.recipe", message=f"is {workload.algorithm.recipe}: verl's recipe trainer, "
                        "which the bundled runtime does not have.", fix="render the plan for verl and run it there")
    request = SolveRequest(
        model=workload.model,
        cluster=workload.cluster,
        prompt_len=workload.data.max_prompt_length,
        response_len=workload.data.max_response_length,
        train_batch_size=workload.data.train_batch_size,
        n=workload.rollout.n,
        algorithm=workload.algorithm.adv_estimator,
        ppo_mini_batch_size=workload.actor.ppo_mini_batch_size,
        lora=workload.model.lora.rank or "off",
        pins={**DEMO_CPU_PINS, **machine_pins, **(pins or {})},
        base=workload,
    )
    result = solve(request)
    if result.plan is None:
        assert result.diagnosis is not None
        raise PlanError(field="demo", message=result.diagnosis.message,
                        fix="free memory on this machine, or run `rlplan run` with a hand-made plan")
    return result.plan
