"""The platform rules: what rlplan's bundled runtime cannot run on one machine. Run only by `rlplan run`, which
passes the `Platform` it detected (runtime/platform.py); verl plans are judged without them.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlplan.planner.plan import RUNTIME_ESTIMATORS
from rlplan.planner.platform import Platform
from rlplan.planner.rules.registry import RuleContext, Violation, rule


def _platform(ctx: RuleContext) -> Platform:
    assert ctx.platform is not None, "check_plan runs platform rules only with a Platform"
    return ctx.platform


@rule("platform", "a plan for GPUs runs on a machine that has them; a CPU-only machine runs a plan solved for it")
def _gpu_plan_needs_a_gpu_machine(ctx: RuleContext) -> Iterator[Violation]:
    # A GPU plan's memory and batch sizes are per GPU; on a CPU machine every rank would share one host's
    # RAM and cores, so none of its predictions hold there (`solve --device cpu` prices this machine).
    cluster = ctx.plan.cluster
    if not _platform(ctx).has_accelerator and not cluster.gpu.is_cpu:
        yield ctx.violation(
            f"the plan was solved for {cluster.nodes * cluster.gpus_per_node} x {cluster.gpu.name} "
            f"on {cluster.nodes} node{'s' if cluster.nodes > 1 else ''}; this machine has no GPU.",
            "run it where those GPUs are, or re-solve it for this CPU machine with `rlplan solve --device cpu "
            "--from` the plan",
            cluster__gpu="cpu",
        )


@rule("platform", "the bundled runtime's rollout engine is vLLM only")
def _runtime_rolls_out_with_vllm(ctx: RuleContext) -> Iterator[Violation]:
    # runtime/rollout/ drives vLLM; an SGLang or TensorRT-LLM plan is for verl, which starts that engine itself.
    if ctx.plan.rollout.name != "vllm":
        yield ctx.violation(
            f"the bundled runtime runs vLLM rollouts only; this plan's rollout engine is {ctx.plan.rollout.name}.",
            "render the plan for verl (rlplan render plan.toml --target verl), or set "
            'rollout.name = "vllm" (re-solve with --rollout vllm) to run it here',
            rollout__name="vllm",
        )


@rule("platform", "the bundled runtime computes the advantage estimators of runtime/algorithms only")
def _runtime_computes_the_estimator(ctx: RuleContext) -> Iterator[Violation]:
    # An imported verl plan may name any of verl's estimators (plan.ESTIMATORS); rlplan run computes four.
    estimator = ctx.plan.algorithm.adv_estimator
    if estimator is None:
        yield ctx.violation(
            f"the plan runs verl's {ctx.plan.algorithm.recipe} recipe, whose own trainer the bundled runtime does not "
            "have.", "render the plan for verl (rlplan render plan.toml --target verl) and run it there")
    elif estimator not in RUNTIME_ESTIMATORS:
        yield ctx.violation(
            f"the bundled runtime computes {', '.join(RUNTIME_ESTIMATORS)} advantages; this plan's estimator is "
            f"{estimator}, which verl computes.",
            "render the plan for verl (rlplan render plan.toml --target verl), or set algorithm.adv_estimator to "
            "one of those to run it here",
        )


@rule("platform",
      "parameter, optimizer and activation offload move tensors off an accelerator; a CPU-only machine has none")
def _host_offload_needs_accelerator(ctx: RuleContext) -> Iterator[Violation]:
    if _platform(ctx).supports_host_offload:
        return
    plan = ctx.plan
    for key, wanted in (
        ("actor.param_offload", plan.actor.param_offload),
        ("actor.optimizer_offload", plan.actor.optimizer_offload),
        ("ref.param_offload", plan.ref.param_offload and plan.uses_reference and not plan.reference_is_actor),
        ("critic.param_offload", plan.critic.param_offload and plan.uses_critic),
        ("critic.optimizer_offload", plan.critic.optimizer_offload and plan.uses_critic),
        ("actor.offload_policy", plan.actor.offload_policy),
        ("critic.offload_policy", plan.critic.offload_policy and plan.uses_critic),
    ):
        if wanted:
            yield ctx.violation(
                "offloading to host memory needs an accelerator (FSDP2's CPUOffloadPolicy cannot run on a "
                "CPU-only machine, where the parameters already live in host memory).",
                f"set {key} = false for a run on this machine", **{key.replace(".", "__"): False},
            )
    if plan.model.activation_offload:
        yield ctx.violation(
            "activation offload moves activations from an accelerator to the host; this machine has none.",
            "set model.activation_offload = false for a run on this machine", model__activation_offload=False,
        )


@rule("platform", "freeing vLLM's cache between rollouts needs its sleep mode")
def _free_cache_needs_sleep_mode(ctx: RuleContext) -> Iterator[Violation]:
    if ctx.plan.rollout.free_cache_engine and not _platform(ctx).supports_sleep_mode:
        yield ctx.violation(
            "vLLM's CPU backend has no sleep mode, so it cannot free its cache between rollouts.",
            "set rollout.free_cache_engine = false for a run on this machine", rollout__free_cache_engine=False,
        )


@rule("platform",
      "on GPUs the bundled runtime colocates one single-GPU vLLM engine with each trainer rank")
def _runtime_rollout_is_single_gpu(ctx: RuleContext) -> Iterator[Violation]:
    tp = ctx.plan.rollout.tensor_model_parallel_size
    if tp > 1 and not _platform(ctx).supports_tensor_parallel_rollout:
        yield ctx.violation(
            "the bundled runtime colocates one single-GPU vLLM engine with each trainer rank; "
            "tensor-parallel engines are not supported by it.",
            "set rollout.tensor_model_parallel_size = 1 (re-solve with --fix rollout.tensor_model_parallel_size=1), "
            "or render the plan for verl",
            rollout__tensor_model_parallel_size=1,
        )


@rule("platform", "the bundled runtime colocates the rollout with the trainer; a pool of its own is verl's recipes'")
def _runtime_colocates_the_rollout(ctx: RuleContext) -> Iterator[Violation]:
    # runtime/ drives one engine per trainer rank on the trainer's own devices; verl's one-step-off and fully async
    # recipes (plan.RolloutPool) start engines on other GPUs and overlap the two, which the runtime does not.
    pool = ctx.plan.rollout.pool
    if pool is not None:
        yield ctx.violation(
            f"this plan puts the rollout on {pool.gpus} GPUs of its own ({pool.nodes} x {pool.gpus_per_node}, "
            "verl's one-step-off or fully async recipe); the bundled runtime runs the rollout on the trainer's "
            "devices only.",
            "render the plan for verl (rlplan render plan.toml --target verl), which runs it through the recipe, "
            "or remove [rollout.pool] to run it colocated here",
        )


@rule("platform", "on CPU the rollout engine computes in the dtype the actor does")
def _rollout_dtype_matches_cpu_trainer(ctx: RuleContext) -> Iterator[Violation]:
    rollout, actor = ctx.plan.rollout, ctx.plan.actor
    if not _platform(ctx).has_accelerator and rollout.dtype != actor.compute_dtype:
        yield ctx.violation(
            f"the CPU trainer computes in {actor.compute_dtype} (actor.compute_dtype) but rollout.dtype is "
            f"{rollout.dtype}: the engine then samples with weights rounded differently from the ones the trainer "
            "scores. A bf16 copy of fp32 weights drops every update smaller than bf16's spacing (about 1e-4 for "
            "weights near 0.02), and sync_logprob_gap grows from step 2.",
            f'set rollout.dtype = "{actor.compute_dtype}" (or actor.compute_dtype to the engine\'s dtype)',
            severity="warning", rollout__dtype=actor.compute_dtype,
        )


@rule("platform", "a compiled CPU engine needs a C++ compiler")
def _compiled_cpu_rollout_needs_a_compiler(ctx: RuleContext) -> Iterator[Violation]:
    if not ctx.plan.rollout.enforce_eager and not _platform(ctx).supports_compiled_rollout:
        yield ctx.violation(
            "rollout.enforce_eager is false, so vLLM's CPU backend compiles the model with torch.compile, "
            "whose C++ kernels need a compiler; this machine has no g++ (or $CXX) on PATH, and the engine "
            "would fail to start.",
            "install g++ (e.g. `apt-get install g++`), or set rollout.enforce_eager = true for an eager engine "
            "(about 1.4x slower to decode in bf16)",
            rollout__enforce_eager=True,
        )


@rule("platform", "the bundled runtime computes in bfloat16 or float32, not float16")
def _runtime_computes_without_loss_scaling(ctx: RuleContext) -> Iterator[Violation]:
    for role in ("actor", "ref", "critic"):
        if getattr(ctx.plan, role).compute_dtype == "float16":
            # fp16's 5-bit exponent underflows small gradients unless the loss is scaled, which the
            # runtime's update (runtime/trainer/optimization.py) does not do.
            yield ctx.violation(
                f"{role}.compute_dtype is float16; rlplan's runtime has no loss scaling, so small gradients "
                "would underflow to zero.",
                f'set {role}.compute_dtype = "bfloat16" (same memory and speed on GPUs), or render the plan '
                "for verl",
                **{f"{role}__compute_dtype": "bfloat16"},
            )


@rule("platform", "a one-node plan wants at most the GPUs this machine has")
def _plan_gpus_on_this_machine(ctx: RuleContext) -> Iterator[Violation]:
    platform, cluster = _platform(ctx), ctx.plan.cluster
    if platform.has_accelerator and cluster.nodes == 1 and cluster.gpus_per_node > platform.accelerator_count:
        yield ctx.violation(
            f"the plan wants {cluster.gpus_per_node} GPUs on one node, this machine has "
            f"{platform.accelerator_count}.",
            f"re-solve the plan for {platform.accelerator_count} GPUs, or run it on a machine that has them",
            cluster__gpus_per_node=platform.accelerator_count,
        )


@rule("platform",
      "the bundled runtime deals every phase's samples out by one Ulysses grouping")
def _runtime_critic_sp_matches_actor(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    actor_sp, critic_sp = plan.actor.ulysses_sequence_parallel_size, plan.critic.ulysses_sequence_parallel_size
    if plan.uses_critic and critic_sp != actor_sp:
        yield ctx.violation(
            f"the bundled runtime deals every phase's samples out by one Ulysses grouping; the actor "
            f"uses {actor_sp}, the critic {critic_sp}.",
            f"set critic.ulysses_sequence_parallel_size = {actor_sp}",
            critic__ulysses_sequence_parallel_size=actor_sp,
        )


@rule("platform", "the bundled runtime trains with FSDP2 only")
def _runtime_trains_with_fsdp2(ctx: RuleContext) -> Iterator[Violation]:
    strategy = ctx.plan.actor.strategy
    if strategy == "megatron":
        yield ctx.violation(
            "the plan trains with Megatron, which the bundled runtime (FSDP2 and peft) does not run; verl runs it.",
            "run it with verl: `rlplan render plan.toml --target verl -o run.sh`, or re-solve the plan for FSDP2",
        )
    elif strategy != "fsdp2":
        yield ctx.violation(
            f"the bundled runtime trains with FSDP2 only, the plan says {strategy!r}.",
            'set actor.strategy = "fsdp2"', actor__strategy="fsdp2",
        )
