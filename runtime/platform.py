"""What this machine can run, and the plan knobs it cannot honour.

The runtime never drops a knob silently: a plan asking for something this
platform cannot do (CPU offload without an accelerator, sleep mode on vLLM's
CPU backend, an unsupported parallelism) fails at start with a PlanError that
names the field and the fix, before any worker starts or anything is written.
"""

from __future__ import annotations

import os

from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import Plan


@frozen(kw_only=True)
class Platform:
    """The device kind the trainer and the rollout run on."""

    device_type: str  # "cuda" or "cpu"
    accelerator_count: int = 0

    @property
    def has_accelerator(self) -> bool:
        return self.device_type != "cpu"

    @property
    def process_group_backend(self) -> str:
        return "nccl" if self.device_type == "cuda" else "gloo"

    @property
    def supports_sleep_mode(self) -> bool:
        # vLLM's CPU backend rejects enable_sleep_mode and turns sleep()/wake_up() into no-ops.
        return self.has_accelerator


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_threads_per_rank(world_size: int, cores: int | None = None) -> int:
    """Intra-op threads for one CPU trainer rank: its share of the machine's cores.

    Trainer ranks run their passes at the same time and the rollout engine runs between them, never
    beside them, so the ranks split the cores between them; one thread per rank left a one-rank
    run on a 2-core machine training on half the machine (issue 12).
    """
    return max(1, (cores if cores is not None else available_cores()) // max(1, world_size))


def detect_platform() -> Platform:
    import torch

    if torch.cuda.is_available():
        return Platform(device_type="cuda", accelerator_count=torch.cuda.device_count())
    return Platform(device_type="cpu")


def _offload_error(field: str) -> PlanError:
    return PlanError(
        field=field,
        message=(
            "offloading to host memory needs an accelerator (FSDP2's CPUOffloadPolicy cannot run on a "
            "CPU-only machine, where the parameters already live in host memory)."
        ),
        fix=f"set {field} = false for a run on this machine",
    )


def unrunnable_knobs(plan: Plan, platform: Platform) -> list[PlanError]:
    """Every knob of `plan` this platform cannot honour, each as a PlanError (empty when runnable)."""
    errors: list[PlanError] = []
    if plan.rollout.name != "vllm":
        # The bundled runtime's rollout engine is vLLM only (runtime/rollout/); an SGLang plan is
        # for verl, which starts SGLang itself.
        errors.append(
            PlanError(
                field="rollout.name",
                message=f"the bundled runtime runs vLLM rollouts only; this plan's rollout engine is "
                        f"{plan.rollout.name}.",
                fix="render the plan for verl (rlplan render plan.toml --target verl), or set "
                    'rollout.name = "vllm" (re-solve with --rollout vllm) to run it here',
            )
        )
    if not platform.has_accelerator:
        for field, wanted in (
            ("actor.param_offload", plan.actor.param_offload),
            ("actor.optimizer_offload", plan.actor.optimizer_offload),
            ("ref.param_offload", plan.ref.param_offload and plan.uses_reference and not plan.reference_is_actor),
            ("critic.param_offload", plan.critic.param_offload and plan.uses_critic),
            ("critic.optimizer_offload", plan.critic.optimizer_offload and plan.uses_critic),
            ("actor.offload_policy", plan.actor.offload_policy),
            ("critic.offload_policy", plan.critic.offload_policy and plan.uses_critic),
        ):
            if wanted:
                errors.append(_offload_error(field))
        if plan.model.activation_offload:
            errors.append(
                PlanError(
                    field="model.activation_offload",
                    message="activation offload moves activations from an accelerator to the host; this machine has none.",
                    fix="set model.activation_offload = false for a run on this machine",
                )
            )
        if plan.rollout.free_cache_engine:
            errors.append(
                PlanError(
                    field="rollout.free_cache_engine",
                    message="vLLM's CPU backend has no sleep mode, so it cannot free its cache between rollouts.",
                    fix="set rollout.free_cache_engine = false for a run on this machine",
                )
            )
    elif plan.rollout.tensor_model_parallel_size > 1:
        errors.append(
            PlanError(
                field="rollout.tensor_model_parallel_size",
                message=(
                    "the bundled runtime colocates one single-GPU vLLM engine with each trainer rank; "
                    "tensor-parallel engines are not supported by it."
                ),
                fix="set rollout.tensor_model_parallel_size = 1 (re-solve with --pin rollout.tensor_model_parallel_size=1), or render the plan for verl",
            )
        )
    if platform.has_accelerator and plan.cluster.gpus_per_node > platform.accelerator_count and plan.cluster.nodes == 1:
        errors.append(
            PlanError(
                field="cluster.gpus_per_node",
                message=(
                    f"the plan wants {plan.cluster.gpus_per_node} GPUs on one node, this machine has "
                    f"{platform.accelerator_count}."
                ),
                fix=f"re-solve the plan for {platform.accelerator_count} GPUs, or run it on a machine that has them",
            )
        )
    actor_sp = plan.actor.ulysses_sequence_parallel_size
    critic_sp = plan.critic.ulysses_sequence_parallel_size
    if plan.uses_critic and critic_sp != actor_sp:
        errors.append(
            PlanError(
                field="critic.ulysses_sequence_parallel_size",
                message=(
                    f"the bundled runtime deals every phase's samples out by one Ulysses grouping; the actor "
                    f"uses {actor_sp}, the critic {critic_sp}."
                ),
                fix=f"set critic.ulysses_sequence_parallel_size = {actor_sp}",
            )
        )
    if plan.actor.strategy != "fsdp2":
        errors.append(
            PlanError(
                field="actor.strategy",
                message=f"the bundled runtime trains with FSDP2 only, the plan says {plan.actor.strategy!r}.",
                fix='set actor.strategy = "fsdp2"',
            )
        )
    world = plan.cluster.world_size
    fsdp_size = plan.actor.fsdp_size
    if fsdp_size not in (-1, world) and (fsdp_size <= 0 or world % fsdp_size != 0):
        errors.append(
            PlanError(
                field="actor.fsdp_size",
                message=f"the FSDP shard group size must divide the world size {world}, got {fsdp_size}.",
                fix="set actor.fsdp_size = -1 (shard over all GPUs) or to a divisor of the world size",
            )
        )
    return errors


def check_plan_runnable(plan: Plan, platform: Platform) -> None:
    """Raise the first unrunnable knob; the CLI prints it as one paragraph and exits 2."""
    errors = unrunnable_knobs(plan, platform)
    if errors:
        raise errors[0]
