"""Every verl rule rlplan enforces, each once, with a name, in this one module.

verl checks a config in six places (validate_config, config dataclasses, worker
constructors, runtime asserts in data dispatch and dynamic batching, vLLM's own
scheduler checks) and mostly reports them as bare asserts after minutes of model
loading.  Here each rule is a named function over the plan and its layout that
reports the numbers involved and the smallest change that fixes it, with that
change as data (`suggested`) so the solver and the tests can apply it.

`stage` says where verl would fail: "config" (validate_config and the config
dataclasses), "worker" (worker-constructor normalization), "runtime" (dispatch,
dynamic batching, vLLM start-up), or "rlplan" (what verl accepts but produces a
broken or wasteful run); "platform" rules say what rlplan's bundled runtime cannot
run on one machine, and run only when `check_plan` is given that machine's
`Platform`.  Rule references in brackets are sections of
shared/reference/verl-rules.md.

The CLI, validate, solve and the runtime (`rlplan run`, with its Platform) all call
`check_plan`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Literal

from attrs import field, frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import knob_value
from rlplan.planner.layout import PlanLayout, normalized_micro_batch, plan_layout
from rlplan.planner.memory.heads import runtime_loss_head
from rlplan.planner.phases import PASS_KNOBS, TOKEN_BUDGET_KEY, Phase
from rlplan.planner.plan import RUNTIME_ESTIMATORS, ActorSection, CriticSection, MegatronSection, Plan
from rlplan.planner.platform import Platform
from rlplan.planner.stack import (
    AGENT_LOOP,
    ASYNC_ROLLOUT_DEFAULT,
    BATCHED_TOKENS_RAISED,
    CHUNKED_PREFILL_NEEDS_MODEL_LEN,
    ENGINE_MICRO_SPLIT_ASSERT,
    ENGINE_WORKER,
    LEN_FROM_SEQUENCES,
    LORA_RANK_UNROUNDED,
    MEGATRON_GRAD_OFFLOAD_ABSENT,
    Behaviour,
    holds,
    vllm_lora_ranks,
)

Severity = Literal["error", "warning"]
Stage = Literal["config", "worker", "runtime", "rlplan", "platform"]

# vLLM's MaxLoRARanks [V10]: the adapter rank is rounded up to one of these (vllm.config.lora
# LoraConfig.max_lora_rank; its import path moves between vLLM versions, so the set is kept here).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@frozen(kw_only=True)
class Violation:
    rule: str
    message: str
    fix: str
    severity: Severity = "error"
    stage: Stage = "config"
    suggested: dict[str, Any] = field(factory=dict)

    @property
    def plan_key(self) -> str:
        """The plan key this is about: the first key its fix changes, else the rule's name."""
        return next(iter(self.suggested), self.rule)

    def as_plan_error(self) -> PlanError:
        """The one paragraph a command that refuses the plan prints (`rlplan run`)."""
        return PlanError(field=self.plan_key, message=self.message, fix=self.fix)


@frozen(kw_only=True)
class RuleContext:
    """What one rule reads, and the rule it is for: `violation` stamps its name and stage."""

    plan: Plan
    layout: PlanLayout
    # The machine the bundled runtime is about to run on; None outside `rlplan run`, and then the
    # "platform" rules are not run.
    platform: Platform | None = None
    # The rule being checked: check_plan hands each registered rule its own copy of the context.
    rule: str = ""
    stage: Stage = "config"

    def violation(self, message: str, fix: str, severity: Any = "error", **suggested: Any) -> Violation:
        """A violation of this context's rule; `suggested` keys are dotted with "__" (actor__fsdp_size)."""
        # `severity` is typed loosely only because fixes arrive as **{"section__key": value} mappings.
        assert severity in ("error", "warning"), severity
        return Violation(
            rule=self.rule, stage=self.stage, message=message, fix=fix, severity=severity,
            suggested={k.replace("__", "."): v for k, v in suggested.items()},
        )


Check = Callable[[RuleContext], Iterator[Violation]]


@frozen(kw_only=True)
class Rule:
    name: str
    stage: Stage
    summary: str
    check: Check
    # The verl behaviour the rule belongs to (planner/stack.py): checked only on stacks where it holds.
    # None: every stack.
    applies: Behaviour | None = None

    def applies_to(self, plan: Plan) -> bool:
        return self.applies is None or holds(self.applies, plan.stack, plan.rollout.name, plan.passthrough)


RULES: list[Rule] = []


def rule(stage: Stage, summary: str, applies: Behaviour | None = None) -> Callable[[Check], Check]:
    """Register a check as a rule named after its function (`_fsdp_size_divides_world` is
    "fsdp_size_divides_world"): the name is written once, and its violations carry it and the stage.
    `applies`: the version-dependent verl behaviour the rule belongs to; on other target stacks it is not run."""

    def register(check: Check) -> Check:
        RULES.append(Rule(name=check.__name__.lstrip("_"), stage=stage, summary=summary, check=check,
                          applies=applies))
        return check

    return register


@frozen(kw_only=True)
class RuleReport:
    violations: tuple[Violation, ...]

    @property
    def errors(self) -> tuple[Violation, ...]:
        return tuple(v for v in self.violations if v.severity == "error")

    @property
    def warnings(self) -> tuple[Violation, ...]:
        return tuple(v for v in self.violations if v.severity == "warning")

    @property
    def valid(self) -> bool:
        return not self.errors


def check_plan(plan: Plan, platform: Platform | None = None) -> RuleReport:
    """Every registered rule over `plan`; the "platform" rules too when the runtime passes its `platform`."""
    layout = plan_layout(plan)
    found: list[Violation] = []
    for registered in RULES:
        if (registered.stage == "platform" and platform is None) or not registered.applies_to(plan):
            continue
        # Built directly rather than evolved from one context: the solver checks every candidate it ranks.
        found.extend(registered.check(RuleContext(plan=plan, layout=layout, platform=platform, rule=registered.name,
                                                  stage=registered.stage)))
    return RuleReport(violations=tuple(found))


def rule_names() -> tuple[str, ...]:
    return tuple(r.name for r in RULES)


# --- small arithmetic for fixes ----------------------------------------------


def _next_multiple(value: int, step: int) -> int:
    return max(step, math.ceil(value / step) * step)


def _largest_divisor_at_most(value: int, limit: int) -> int:
    best = 1
    for candidate in range(1, min(value, max(limit, 1)) + 1):
        if value % candidate == 0:
            best = candidate
    return best


def _smallest_train_batch(train_batch: int, n: int, divisor: int) -> int:
    """Smallest train_batch_size >= the current one with train_batch * n divisible by `divisor`."""
    step = divisor // math.gcd(divisor, n)
    return _next_multiple(train_batch, step)


# --- config stage: validate_config and the config dataclasses [1, 3] ----------


@rule("config", "[V2] without dynamic bsz, train_batch_size * n % n_gpus == 0")
def _real_batch_divisible_by_world(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    world, n, tbs = plan.cluster.world_size, plan.rollout.n, plan.data.train_batch_size
    if not plan.actor.use_dynamic_bsz and (tbs * n) % world:
        better = _smallest_train_batch(tbs, n, world)
        yield ctx.violation(
            f"train_batch_size * rollout.n = {tbs} * {n} = {tbs * n} sequences is not divisible by the {world} GPUs.",
            f"set data.train_batch_size = {better} (or enable actor.use_dynamic_bsz)",
            data__train_batch_size=better,
        )


@rule("config", "[V3] train_batch_size >= ppo_mini_batch_size (prompts)")
def _mini_batch_within_train_batch(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    tbs, mini = plan.data.train_batch_size, plan.actor.ppo_mini_batch_size
    if not plan.actor.use_dynamic_bsz and tbs < mini:
        yield ctx.violation(
            f"actor.ppo_mini_batch_size ({mini} prompts) exceeds data.train_batch_size ({tbs} prompts).",
            f"set actor.ppo_mini_batch_size = {tbs}",
            actor__ppo_mini_batch_size=tbs,
        )


def _exactly_one(ctx: RuleContext, what: str, phase: Phase,
                 per_gpu: int | None, global_value: int | None, default_per_gpu: int) -> Iterator[Violation]:
    per_gpu_key, global_key = PASS_KNOBS[phase].micro_batch, PASS_KNOBS[phase].legacy_micro_batch
    if per_gpu is not None and global_value is not None:
        yield ctx.violation(
            f"both {global_key} = {global_value} (deprecated, global) and {per_gpu_key} = {per_gpu} are set for {what}.",
            f"remove {global_key}",
        )
    elif per_gpu is None and global_value is None:
        yield ctx.violation(
            f"neither {per_gpu_key} nor {global_key} is set for {what}, and dynamic batch size is off.",
            f"set {per_gpu_key} = {default_per_gpu} (or enable dynamic batch size)",
            **{per_gpu_key.replace(".", "__"): default_per_gpu},
        )


@rule("config", "[3 ActorConfig] without dynamic bsz, exactly one actor micro-batch key")
def _actor_micro_batch_exactly_one(ctx: RuleContext) -> Iterator[Violation]:
    actor = ctx.plan.actor
    if not actor.use_dynamic_bsz:
        yield from _exactly_one(
            ctx, "the actor update", Phase.ACTOR_UPDATE,
            actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, 1,
        )


@rule("config",
      "[V3] a global ppo_micro_batch_size divides ppo_mini_batch_size and micro * sp >= n_gpus")
def _actor_global_micro_batch_consistent(ctx: RuleContext) -> Iterator[Violation]:
    plan, actor = ctx.plan, ctx.plan.actor
    micro = actor.ppo_micro_batch_size
    if actor.use_dynamic_bsz or micro is None:
        return
    world, sp = plan.cluster.world_size, actor.ulysses_sequence_parallel_size
    if actor.ppo_mini_batch_size % micro:
        better = _largest_divisor_at_most(actor.ppo_mini_batch_size, micro)
        yield ctx.violation(
            f"actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size}) is not divisible by the global "
            f"actor.ppo_micro_batch_size ({micro}).",
            f"replace actor.ppo_micro_batch_size with actor.ppo_micro_batch_size_per_gpu, or set it to {better}",
            actor__ppo_micro_batch_size=better,
        )
    if micro * sp < world:
        yield ctx.violation(
            f"the global actor.ppo_micro_batch_size ({micro}) times Ulysses sp ({sp}) is below the {world} GPUs, "
            "so some GPUs would get no micro batch.",
            f"set actor.ppo_micro_batch_size >= {math.ceil(world / sp)}, or use actor.ppo_micro_batch_size_per_gpu",
            actor__ppo_micro_batch_size=math.ceil(world / sp),
        )


@rule("config",
      "[V4] without actor dynamic bsz, exactly one log-prob micro-batch key for rollout (and ref when used)")
def _log_prob_micro_batch_exactly_one(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.actor.use_dynamic_bsz:
        return
    yield from _exactly_one(
        ctx, "the old-log-prob pass", Phase.OLD_LOG_PROB,
        plan.rollout.log_prob_micro_batch_size_per_gpu, plan.rollout.log_prob_micro_batch_size, 1,
    )
    if plan.uses_reference:
        yield from _exactly_one(
            ctx, "the reference log-prob pass", Phase.REF_LOG_PROB,
            plan.ref.log_prob_micro_batch_size_per_gpu, plan.ref.log_prob_micro_batch_size, 1,
        )


@rule("config",
      "[V7, 3 CriticConfig] critic mini <= train batch, exactly one micro key, global micro divides mini and covers GPUs")
def _critic_batch_consistent(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if not plan.uses_critic or plan.critic.use_dynamic_bsz:
        return
    critic = plan.critic
    mini = ctx.layout.critic_ppo_mini_batch_size
    assert mini is not None, "the layout has a critic whenever the plan uses one"
    if plan.data.train_batch_size < mini:
        yield ctx.violation(
            f"critic.ppo_mini_batch_size ({mini}) exceeds data.train_batch_size ({plan.data.train_batch_size}).",
            f"set critic.ppo_mini_batch_size = {plan.data.train_batch_size}",
            critic__ppo_mini_batch_size=plan.data.train_batch_size,
        )
    yield from _exactly_one(
        ctx, "the critic update", Phase.CRITIC_UPDATE,
        critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size, 1,
    )
    micro = critic.ppo_micro_batch_size
    if micro is not None:
        world, sp = plan.cluster.world_size, critic.ulysses_sequence_parallel_size
        if mini % micro:
            yield ctx.violation(
                f"critic mini batch ({mini}) is not divisible by the global critic.ppo_micro_batch_size ({micro}).",
                f"set critic.ppo_micro_batch_size = {_largest_divisor_at_most(mini, micro)}",
                critic__ppo_micro_batch_size=_largest_divisor_at_most(mini, micro),
            )
        if micro * sp < world:
            yield ctx.violation(
                f"the global critic.ppo_micro_batch_size ({micro}) times sp ({sp}) is below the {world} GPUs.",
                f"set critic.ppo_micro_batch_size >= {math.ceil(world / sp)}",
                critic__ppo_micro_batch_size=math.ceil(world / sp),
            )


@rule("config", "[3 FSDPActorConfig] Ulysses sp > 1 requires use_remove_padding")
def _ulysses_needs_remove_padding(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.actor.ulysses_sequence_parallel_size > 1 and not plan.model.use_remove_padding:
        yield ctx.violation(
            f"actor.ulysses_sequence_parallel_size = {plan.actor.ulysses_sequence_parallel_size} needs packed "
            "sequences, but model.use_remove_padding is false.",
            "set model.use_remove_padding = true", model__use_remove_padding=True,
        )
    if plan.uses_critic and plan.critic.ulysses_sequence_parallel_size > 1 and not plan.critic.use_remove_padding:
        yield ctx.violation(
            "critic.ulysses_sequence_parallel_size > 1 needs critic.use_remove_padding.",
            "set critic.use_remove_padding = true", critic__use_remove_padding=True,
        )


@rule("config", "[V10] vLLM serves LoRA ranks up to 512")
def _lora_rank_within_vllm_limit(ctx: RuleContext) -> Iterator[Violation]:
    rank = ctx.plan.model.lora.rank
    # verl checks it only for vLLM (verl/utils/config.py validate_config: get_vllm_max_lora_rank).
    if ctx.plan.rollout.name == "vllm" and rank > VLLM_LORA_RANKS[-1]:
        yield ctx.violation(
            f"model.lora.rank = {rank} exceeds vLLM's largest LoRA rank ({VLLM_LORA_RANKS[-1]}).",
            f"set model.lora.rank <= {VLLM_LORA_RANKS[-1]}", model__lora__rank=VLLM_LORA_RANKS[-1],
        )


@rule("runtime", "verl before 0.6.1 hands vLLM the LoRA rank itself: it must be a rank vLLM takes",
      applies=LORA_RANK_UNROUNDED)
def _lora_rank_is_one_vllm_takes(ctx: RuleContext) -> Iterator[Violation]:
    """vLLM's LoRAConfig refuses a max_lora_rank outside its set (ValueError at engine start); verl 0.4.0-0.6.0
    passes model.lora_rank as it is (stack.LORA_RANK_UNROUNDED), later releases round it up."""
    plan, rank = ctx.plan, ctx.plan.model.lora.rank
    ranks = vllm_lora_ranks(plan.stack)
    if plan.rollout.name == "vllm" and plan.model.lora.enabled and rank not in ranks:
        better = next((r for r in ranks if r >= rank), ranks[-1])
        yield ctx.violation(
            f"model.lora.rank = {rank} is not one of the ranks vLLM {plan.stack.version_of('vllm')} takes "
            f"({', '.join(map(str, ranks))}), and verl {plan.stack.verl} passes it unrounded as max_lora_rank.",
            f"set model.lora.rank = {better}", model__lora__rank=better,
        )


@rule("config",
      "[2.4b] a pinned actor.loss_head should be the head the rendered config runs")
def _loss_head_is_what_the_runtime_runs(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    runs = runtime_loss_head(plan)
    if plan.actor.loss_head not in ("auto", runs):
        fix = ("set model.use_fused_kernels = true" if plan.actor.loss_head == "fused"
               else 'set actor.loss_head = "auto"')
        yield ctx.violation(
            f'actor.loss_head = "{plan.actor.loss_head}" prices a head this config does not run: '
            f"verl (or rlplan's CPU runtime) runs {runs} for it, so the memory verdict may not hold.",
            fix, severity="warning", actor__loss_head="auto",
        )


def _trained_sections(plan: Plan) -> Iterator[tuple[Literal["actor", "critic"], ActorSection | CriticSection]]:
    """The sections verl trains with their own FSDP state: the actor's, and the critic's when the plan has one."""
    yield "actor", plan.actor
    if plan.uses_critic:
        yield "critic", plan.critic


@rule("worker", "fsdp_config.offload_policy takes effect only with strategy fsdp2")
def _offload_policy_needs_fsdp2(ctx: RuleContext) -> Iterator[Violation]:
    """verl reads offload_policy only on its fsdp2 branch and builds FSDP1 without any CPU offload.

    verl/workers/fsdp_workers.py: ActorRolloutRefWorker._build_model_optimizer (`if role == "actor" and
    fsdp_config.offload_policy: cpu_offload = CPUOffloadPolicy(pin_memory=True)` under `fsdp_strategy ==
    "fsdp2"`) and CriticWorker._build_critic_model_optimizer (`cpu_offload=None` under `config.strategy ==
    "fsdp"`). An FSDP1 plan asking for it would keep its whole state on the GPU.
    """
    plan = ctx.plan
    if plan.actor.strategy == "fsdp2":
        return
    for section, config in _trained_sections(plan):
        if config.offload_policy:
            yield ctx.violation(
                f"{section}.offload_policy is true, but verl builds the {section} with FSDP1 for strategy "
                f'"{plan.actor.strategy}" and ignores it: params, grads and optimizer state stay on the GPU.',
                'set actor.strategy = "fsdp2"', actor__strategy="fsdp2",
            )


@rule("worker",
      "with fsdp_config.offload_policy verl turns param_offload and optimizer_offload off")
def _offload_policy_supersedes_offloads(ctx: RuleContext) -> Iterator[Violation]:
    """fsdp_workers.py sets `self._is_offload_param = self._is_offload_optimizer = False` when offload_policy is on.

    (ActorRolloutRefWorker._build_model_optimizer and CriticWorker._build_critic_model_optimizer, fsdp2 branch.)
    """
    plan = ctx.plan
    if plan.actor.strategy != "fsdp2":
        return
    for section, config in _trained_sections(plan):
        if config.offload_policy and (config.param_offload or config.optimizer_offload):
            yield ctx.violation(
                f"{section}.offload_policy keeps the {section}'s state in host RAM for the whole step, so verl "
                f"ignores {section}.param_offload / optimizer_offload.",
                f"set {section}.param_offload = false and {section}.optimizer_offload = false", severity="warning",
                **{f"{section}__param_offload": False, f"{section}__optimizer_offload": False},
            )


# --- worker stage: global -> per-GPU normalization [2a, 2b] --------------------


@rule("worker", "[N1] an HSDP fsdp_size must divide the world size")
def _fsdp_size_divides_world(ctx: RuleContext) -> Iterator[Violation]:
    world, fsdp = ctx.plan.cluster.world_size, ctx.plan.actor.fsdp_size
    if 0 < fsdp < world and world % fsdp:
        better = _largest_divisor_at_most(world, fsdp)
        yield ctx.violation(
            f"actor.fsdp_size = {fsdp} does not divide the {world} GPUs, so no (replicas, shards) mesh exists.",
            f"set actor.fsdp_size = {better} (or -1 for full sharding)", actor__fsdp_size=better,
        )
    if fsdp == 0:
        yield ctx.violation(
            "actor.fsdp_size = 0 is not a mesh size.",
            "set actor.fsdp_size = -1 (shard over all GPUs)", actor__fsdp_size=-1,
        )


@rule("worker", "[N2] world_size % ulysses_sequence_parallel_size == 0")
def _ulysses_divides_world(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    world = plan.cluster.world_size
    for section, config in _trained_sections(plan):
        sp = config.ulysses_sequence_parallel_size
        if world % sp:
            better = _largest_divisor_at_most(world, sp)
            yield ctx.violation(
                f"{section}.ulysses_sequence_parallel_size = {sp} does not divide the {world} GPUs.",
                f"set {section}.ulysses_sequence_parallel_size = {better}",
                **{f"{section}__ulysses_sequence_parallel_size": better},
            )


def _micro_key(phase: Phase, per_gpu: int | None) -> str:
    """The micro-batch key a pass's plan sets: the per-GPU one, else verl's older global one."""
    knobs = PASS_KNOBS[phase]
    key = knobs.micro_batch if per_gpu is not None else knobs.legacy_micro_batch
    assert key is not None, f"{phase} has no global micro-batch key"
    return key


def _micro_rules(ctx: RuleContext, section: str, mini_prompts: int, mini_per_gpu: int, micro_key: str,
                 micro_per_gpu: int | None, from_global: bool) -> Iterator[Violation]:
    """[N3, N5] normalized mini > 0; a set micro batch divides it and is at most it."""
    if mini_per_gpu <= 0:
        yield ctx.violation(
            f"{section}.ppo_mini_batch_size = {mini_prompts} prompts normalizes to 0 sequences per data-parallel rank.",
            f"raise {section}.ppo_mini_batch_size so that ppo_mini_batch_size * n >= dp",
        )
        return
    if micro_per_gpu is None:
        return
    if micro_per_gpu <= 0:
        yield ctx.violation(
            f"the global {micro_key} normalizes to 0 per GPU (it is divided by dp, not multiplied by n).",
            f"use {section}.ppo_micro_batch_size_per_gpu = 1 instead",
            **{f"{section}__ppo_micro_batch_size_per_gpu": 1},
        )
        return
    if mini_per_gpu % micro_per_gpu or mini_per_gpu // micro_per_gpu == 0:
        better = _largest_divisor_at_most(mini_per_gpu, micro_per_gpu)
        source = f"the global {micro_key} normalized to" if from_global else f"{micro_key} ="
        yield ctx.violation(
            f"the mini batch per GPU ({section}.ppo_mini_batch_size * n / dp = {mini_per_gpu} sequences) is not a "
            f"multiple of the micro batch ({source} {micro_per_gpu}).",
            f"set {section}.ppo_micro_batch_size_per_gpu = {better}",
            **{f"{section}__ppo_micro_batch_size_per_gpu": better},
        )


@rule("worker",
      "[N3, N5] normalized actor mini > 0, and a set micro batch per GPU divides it")
def _actor_micro_batch_divides_mini(ctx: RuleContext) -> Iterator[Violation]:
    plan, dp = ctx.plan, ctx.layout.parallel.dp
    if dp <= 0:
        return
    actor = plan.actor
    micro = normalized_micro_batch(actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, dp)
    mini_per_gpu = ctx.layout.actor_update.mini_batch_size_per_gpu
    assert mini_per_gpu is not None, "an update pass has a mini batch"
    yield from _micro_rules(
        ctx, "actor", actor.ppo_mini_batch_size, mini_per_gpu,
        _micro_key(Phase.ACTOR_UPDATE, actor.ppo_micro_batch_size_per_gpu),
        micro, actor.ppo_micro_batch_size_per_gpu is None,
    )


@rule("worker",
      "[2b] normalized critic mini > 0, and a set critic micro batch per GPU divides it")
def _critic_micro_batch_divides_mini(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if not plan.uses_critic or ctx.layout.critic_parallel is None or ctx.layout.critic_parallel.dp <= 0:
        return
    critic, dp, mini = plan.critic, ctx.layout.critic_parallel.dp, ctx.layout.critic_ppo_mini_batch_size
    update = ctx.layout.critic_update
    assert mini is not None and update is not None and update.mini_batch_size_per_gpu is not None, (
        "the layout has a critic whenever the plan uses one")
    micro = normalized_micro_batch(critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size, dp)
    yield from _micro_rules(
        ctx, "critic", mini, update.mini_batch_size_per_gpu,
        _micro_key(Phase.CRITIC_UPDATE, critic.ppo_micro_batch_size_per_gpu),
        micro, critic.ppo_micro_batch_size_per_gpu is None,
    )


@rule("worker", "[N6] a global log-prob micro batch must not normalize to 0")
def _log_prob_micro_batch_positive(ctx: RuleContext) -> Iterator[Violation]:
    plan, dp = ctx.plan, ctx.layout.parallel.dp
    pairs = [(Phase.OLD_LOG_PROB, plan.rollout.log_prob_micro_batch_size, plan.rollout.log_prob_use_dynamic_bsz)]
    if plan.uses_reference:
        pairs.append((Phase.REF_LOG_PROB, plan.ref.log_prob_micro_batch_size, plan.ref.log_prob_use_dynamic_bsz))
    for phase, global_size, dynamic in pairs:
        if global_size is not None and not dynamic and dp > 0 and global_size // dp == 0:
            knobs = PASS_KNOBS[phase]
            yield ctx.violation(
                f"the global {knobs.legacy_micro_batch} = {global_size} normalizes to 0 per GPU over "
                f"{dp} data-parallel ranks.",
                f"replace it with {knobs.micro_batch} = 1",
                **{knobs.micro_batch.replace(".", "__"): 1},
            )


@rule("worker",
      "[2e] verl's engine worker asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz",
      applies=ENGINE_WORKER)
def _dynamic_bsz_flags_agree(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.actor.use_dynamic_bsz != plan.rollout.log_prob_use_dynamic_bsz:
        yield ctx.violation(
            f"actor.use_dynamic_bsz = {str(plan.actor.use_dynamic_bsz).lower()} but "
            f"rollout.log_prob_use_dynamic_bsz = {str(plan.rollout.log_prob_use_dynamic_bsz).lower()}; verl's "
            f"engine worker (the default from verl 0.8; this plan targets {plan.stack.verl}) asserts they agree.",
            f"set rollout.log_prob_use_dynamic_bsz = {str(plan.actor.use_dynamic_bsz).lower()}",
            rollout__log_prob_use_dynamic_bsz=plan.actor.use_dynamic_bsz,
        )


@rule("worker",
      "[2e] ppo_mini_batch_size * n splits evenly over the dp ranks (engine worker's train_mini_batch)",
      applies=ENGINE_WORKER)
def _mini_batch_divisible_by_dp(ctx: RuleContext) -> Iterator[Violation]:
    """verl/workers/engine_workers.py train_mini_batch asserts `mini_batch_size % dp == 0` (v0.8.0 on). The legacy
    workers (fsdp_workers.py / megatron_workers.py __init__, v0.3-v0.7.x) floor-divide ppo_mini_batch_size * n by
    dp and run a short last mini batch (rule mini_batches_split_evenly warns of it)."""
    plan = ctx.plan
    pairs = [("actor", plan.actor.ppo_mini_batch_size, ctx.layout.parallel.dp)]
    critic_mini = ctx.layout.critic_ppo_mini_batch_size
    if plan.uses_critic and ctx.layout.critic_parallel is not None and critic_mini is not None:
        pairs.append(("critic", critic_mini, ctx.layout.critic_parallel.dp))
    n = plan.rollout.n
    for section, mini, dp in pairs:
        if dp > 0 and (mini * n) % dp:
            better = _next_multiple(mini, dp // math.gcd(dp, n))
            yield ctx.violation(
                f"{section}.ppo_mini_batch_size * n = {mini} * {n} = {mini * n} sequences per optimizer step do "
                f"not split evenly over {dp} data-parallel ranks (verl 0.8 silently floor-divides, 0.9 asserts).",
                f"set {section}.ppo_mini_batch_size = {better}",
                **{f"{section}__ppo_mini_batch_size": better},
            )


@rule("config",
      "[N4, N6] global micro-batch keys are normalized by verl 0.8 but rejected by verl >= 0.9")
def _deprecated_global_micro_batch_keys(ctx: RuleContext) -> Iterator[Violation]:
    plan, dp = ctx.plan, max(ctx.layout.parallel.dp, 1)
    for phase in (Phase.ACTOR_UPDATE, Phase.OLD_LOG_PROB, Phase.REF_LOG_PROB):
        key, per_gpu_key = PASS_KNOBS[phase].legacy_micro_batch, PASS_KNOBS[phase].micro_batch
        value = knob_value(plan, key) if key else None
        if value is not None:
            per_gpu = max(1, value // dp)
            yield ctx.violation(
                f"{key} = {value} is a deprecated global key: verl 0.8 turns it into {per_gpu} per GPU "
                f"(divided by dp = {dp}, not multiplied by n); verl 0.9's engine worker rejects it.",
                f"replace it with {per_gpu_key} = {per_gpu}", severity="warning",
            )


# --- runtime stage: dispatch, dynamic batching, Ulysses, vLLM [4] --------------


@rule("runtime",
      "[R1] with dynamic bsz, max_token_len_per_gpu * sp >= max_prompt_length + max_response_length")
def _token_budget_fits_longest_sequence(ctx: RuleContext) -> Iterator[Violation]:
    longest = ctx.plan.data.max_sequence_length
    for role in ctx.layout.roles:
        budget = role.token_budget_per_sp_group
        if budget is not None and budget < longest:
            needed = math.ceil(longest / role.sequence_parallel_size)
            key = TOKEN_BUDGET_KEY[role.role]
            yield ctx.violation(
                f"{key} = {role.max_token_len_per_gpu} (x sp {role.sequence_parallel_size} = {budget} "
                f"tokens) cannot hold one full sequence of {longest} tokens (prompt + response).",
                f"set {key} >= {needed} (verl recommends 2-3x that)",
                **{key.replace(".", "__"): needed},
            )


@rule("runtime",
      "[R3, R4] train_batch_size * n sequences split evenly over the dp ranks (dispatch and balance_batch)")
def _dispatch_divisible_by_dp(ctx: RuleContext) -> Iterator[Violation]:
    plan, dp = ctx.plan, ctx.layout.parallel.dp
    if dp <= 0:
        return
    total = plan.data.train_batch_size * plan.rollout.n
    if total % dp or total < dp:
        better = _smallest_train_batch(plan.data.train_batch_size, plan.rollout.n, dp)
        yield ctx.violation(
            f"{total} sequences per step (train_batch_size {plan.data.train_batch_size} x n {plan.rollout.n}) "
            f"do not split evenly over {dp} data-parallel ranks.",
            f"set data.train_batch_size = {better}", data__train_batch_size=better,
        )


@rule("runtime",
      "[2e] a fixed log-prob micro batch divides each rank's share of the batch (engine worker's split)",
      applies=ENGINE_MICRO_SPLIT_ASSERT)
def _log_prob_micro_batch_divides_batch(ctx: RuleContext) -> Iterator[Violation]:
    """verl/workers/engine/utils.py prepare_micro_batches asserts `total_data_size % (force_group_size *
    micro_batch_size_per_gpu) == 0` (v0.7.1 on, the engine worker's). The legacy workers (v0.3-v0.7.x:
    dp_actor.py compute_log_prob, `batch.split(micro_batch_size)`) take a short last micro batch instead."""
    for role in (ctx.layout.old_log_prob, ctx.layout.ref_log_prob):
        if role is None:  # no reference pass
            continue
        micro = role.micro_batch_size_per_gpu
        if micro is None or micro <= 0 or role.sequences_per_gpu <= 0:
            continue
        if role.sequences_per_gpu % micro:
            better = _largest_divisor_at_most(role.sequences_per_gpu, micro)
            key = PASS_KNOBS[role.role].micro_batch
            yield ctx.violation(
                f"{role.sequences_per_gpu} sequences per GPU do not split into log-prob micro batches of {micro}.",
                f"set {key} = {better}", **{key.replace(".", "__"): better},
            )


@rule("runtime",
      "[R2] train_batch_size * n splits evenly over rollout.agent_num_workers (verl's agent loop)",
      applies=AGENT_LOOP)
def _agent_loop_chunks_evenly(ctx: RuleContext) -> Iterator[Violation]:
    """The agent loop (v0.5.0 on) runs only for an async rollout: rollout.mode=async in v0.5.0-v0.6.1, always from
    v0.7.0 (stack.ASYNC_ROLLOUT_DEFAULT); the sync rollout generates the whole batch in the trainer's process."""
    plan = ctx.plan
    if not holds(ASYNC_ROLLOUT_DEFAULT, plan.stack) and \
            passthrough_value(plan, ROLLOUT_MODE_KEY, "sync").strip("'\"") != "async":
        return
    total, workers = plan.data.train_batch_size * plan.rollout.n, plan.rollout.agent_num_workers
    if total % workers:
        better = math.gcd(total, workers)
        yield ctx.violation(
            f"{total} sequences per step do not split evenly over rollout.agent_num_workers = {workers}.",
            f"set rollout.agent_num_workers = {better}", rollout__agent_num_workers=better,
        )


@rule("runtime",
      "[R5] num_attention_heads % sp == 0 and (num_kv_heads % sp == 0 or sp % num_kv_heads == 0)")
def _ulysses_divides_heads(ctx: RuleContext) -> Iterator[Violation]:
    plan, arch = ctx.plan, ctx.plan.model.arch
    sizes = [("actor", plan.actor.ulysses_sequence_parallel_size)]
    if plan.uses_critic:
        sizes.append(("critic", plan.critic.ulysses_sequence_parallel_size))
    for section, sp in sizes:
        if sp <= 1:
            continue
        if not arch.splits_heads(sp):
            best = max(d for d in range(1, sp + 1) if arch.splits_heads(d))
            yield ctx.violation(
                f"{section}.ulysses_sequence_parallel_size = {sp} does not split {arch.num_attention_heads} attention "
                f"heads / {arch.num_kv_heads} KV heads evenly.",
                f"set {section}.ulysses_sequence_parallel_size = {best}",
                **{f"{section}__ulysses_sequence_parallel_size": best},
            )


@rule("runtime", "[R6] world_size % rollout tensor_model_parallel_size == 0")
def _rollout_tp_divides_world(ctx: RuleContext) -> Iterator[Violation]:
    world, tp = ctx.plan.cluster.world_size, ctx.plan.rollout.tensor_model_parallel_size
    if world % tp:
        better = _largest_divisor_at_most(world, tp)
        yield ctx.violation(
            f"rollout.tensor_model_parallel_size = {tp} does not divide the {world} GPUs into whole vLLM replicas.",
            f"set rollout.tensor_model_parallel_size = {better}", rollout__tensor_model_parallel_size=better,
        )
    elif tp > ctx.plan.cluster.gpus_per_node:
        yield ctx.violation(
            f"rollout TP {tp} spans nodes of {ctx.plan.cluster.gpus_per_node} GPUs: tensor-parallel all-reduces cross "
            "the inter-node network and verl needs vLLM >= 0.11.1 for it.",
            "prefer a TP that fits in one node unless the weights do not fit otherwise",
            severity="warning",
        )


@rule("runtime",
      "[R8] the engine's TP must divide the attention heads (and KV heads, or be a multiple)")
def _rollout_tp_divides_heads(ctx: RuleContext) -> Iterator[Violation]:
    """vLLM's and SGLang's attention layers both shard heads over TP: heads % tp == 0, and KV heads either
    split (kv % tp == 0) or are replicated (tp % kv == 0) (the same asserts in the attention constructors of
    sglang python/sglang/srt/models/*)."""
    arch, tp = ctx.plan.model.arch, ctx.plan.rollout.tensor_model_parallel_size
    if not arch.splits_heads(tp, latent_kv=True):
        best = max(d for d in range(1, tp + 1) if arch.splits_heads(d, latent_kv=True))
        yield ctx.violation(
            f"rollout.tensor_model_parallel_size = {tp} does not split {arch.num_attention_heads} attention heads / "
            f"{arch.num_kv_heads} KV heads.",
            f"set rollout.tensor_model_parallel_size = {best}", rollout__tensor_model_parallel_size=best,
        )


@rule("runtime",
      "[R7] max_model_len <= max_position_embeddings and > max_prompt_length")
def _max_model_len_within_model(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    limit, max_len = plan.model.arch.max_position_embeddings, plan.verl_max_model_len
    # Before v0.7.0 verl passes prompt + response where max_model_len is unset (stack.LEN_FROM_SEQUENCES).
    if plan.rollout.max_model_len is None and not holds(LEN_FROM_SEQUENCES, plan.stack):
        yield ctx.violation(
            f"rollout.max_model_len is not set, so verl {plan.stack.verl} sizes vLLM for max_position_embeddings = "
            f"{limit} tokens instead of the plan's sequences.",
            f"set rollout.max_model_len = {plan.fitting_max_model_len}",
            severity="warning", rollout__max_model_len=plan.fitting_max_model_len,
        )
    if max_len > limit:
        yield ctx.violation(
            f"rollout.max_model_len = {max_len} exceeds the model's max_position_embeddings = {limit}.",
            f"set rollout.max_model_len = {plan.fitting_max_model_len}",
            rollout__max_model_len=plan.fitting_max_model_len,
        )
    if plan.data.max_prompt_length >= max_len:
        yield ctx.violation(
            f"data.max_prompt_length = {plan.data.max_prompt_length} leaves no room for a response within "
            f"max_model_len = {max_len}; vLLM rejects such prompts.",
            f"set rollout.max_model_len = {plan.data.max_sequence_length}",
            rollout__max_model_len=plan.data.max_sequence_length,
        )
    elif max_len < plan.data.max_sequence_length:
        yield ctx.violation(
            f"max_model_len = {max_len} is shorter than prompt + response = {plan.data.max_sequence_length}: long "
            "prompts get shorter responses than data.max_response_length.",
            f"set rollout.max_model_len = {plan.fitting_max_model_len}",
            severity="warning", rollout__max_model_len=plan.fitting_max_model_len,
        )
    if plan.data.max_sequence_length > limit:
        yield ctx.violation(
            f"prompt + response = {plan.data.max_sequence_length} tokens exceeds the model's "
            f"max_position_embeddings = {limit}.",
            f"set data.max_response_length = {limit - plan.data.max_prompt_length}",
            data__max_response_length=max(1, limit - plan.data.max_prompt_length),
        )


@rule("runtime",
      "[R8] max_num_batched_tokens >= max_num_seqs, and >= max_model_len without chunked prefill")
def _batched_tokens_cover_sequences(ctx: RuleContext) -> Iterator[Violation]:
    """vLLM's scheduler check (vllm/config/scheduler.py). verl passes neither key to SGLang (see
    SGLANG_IGNORED_ROLLOUT_KEYS), which sizes its own chunked prefill, so an SGLang plan is not judged by it."""
    rollout = ctx.plan.rollout
    if rollout.name == "sglang":
        return
    if rollout.max_num_batched_tokens < rollout.max_num_seqs:
        yield ctx.violation(
            f"rollout.max_num_batched_tokens = {rollout.max_num_batched_tokens} is below rollout.max_num_seqs = "
            f"{rollout.max_num_seqs}; vLLM's scheduler refuses to start.",
            f"set rollout.max_num_batched_tokens = {rollout.max_num_seqs}",
            rollout__max_num_batched_tokens=rollout.max_num_seqs,
        )
    plan = ctx.plan
    max_len = plan.verl_max_model_len
    if rollout.max_num_batched_tokens >= max_len:
        return
    sync = passthrough_value(plan, ROLLOUT_MODE_KEY, "sync").strip("'\"") != "async"
    if holds(CHUNKED_PREFILL_NEEDS_MODEL_LEN, plan.stack) and sync:
        yield ctx.violation(
            f"rollout.max_num_batched_tokens = {rollout.max_num_batched_tokens} is below max_model_len = {max_len}: "
            f"verl {plan.stack.verl}'s sync vLLM rollout refuses it with chunked prefill on, and vLLM without.",
            f"set rollout.max_num_batched_tokens = {max_len}", rollout__max_num_batched_tokens=max_len,
        )
    elif not rollout.enable_chunked_prefill and holds(BATCHED_TOKENS_RAISED, plan.stack):
        yield ctx.violation(
            f"without chunked prefill verl {plan.stack.verl} raises rollout.max_num_batched_tokens = "
            f"{rollout.max_num_batched_tokens} to max_model_len = {max_len}: vLLM's profile run (and memory) grows.",
            f"set rollout.max_num_batched_tokens = {max_len}, or rollout.enable_chunked_prefill = true",
            severity="warning", rollout__max_num_batched_tokens=max_len,
        )
    elif not rollout.enable_chunked_prefill:
        yield ctx.violation(
            f"without chunked prefill, rollout.max_num_batched_tokens = {rollout.max_num_batched_tokens} must hold "
            f"a whole max_model_len = {max_len} prompt.",
            "set rollout.enable_chunked_prefill = true", rollout__enable_chunked_prefill=True,
        )


# verl's switch that merges LoRA adapters into the base weights before each sync.
LORA_MERGE_KEY = "actor_rollout_ref.model.lora.merge"


def passthrough_value(plan: Plan, key: str, default: str) -> str:
    """An unmodeled verl key's value as text, however the script spelled the override: `key=`, `+key=` (how
    real scripts add keys verl's YAML lacks) or `++key=`; Hydra applies them in order, so `++` wins."""
    for spelling in ("++" + key, "+" + key, key):
        if spelling in plan.passthrough:
            return str(plan.passthrough[spelling])
    return default


@rule("runtime",
      "[R9] SGLang receives full weights only: LoRA with SGLang needs model.lora.merge")
def _sglang_lora_needs_merged_adapter(ctx: RuleContext) -> Iterator[Violation]:
    """verl (b178a3cd) gives SGLang no LoRA arguments (sglang_rollout/async_sglang_server.py server args),
    and SGLangRollout.update_weights (sglang_rollout/sglang_rollout.py) loads every pushed tensor by name
    into the base model.  After the first sync verl pushes adapter tensors only
    (fsdp_workers.py rollout_mode: collect_lora_params with base_sync_done), unless model.lora.merge
    is set (engine_workers.py update_weights: `peft_merge` skips the adapter-only sync), so the
    adapter must be merged into the base weights before the sync.
    """
    plan = ctx.plan
    merged = (plan.model.lora.merge if plan.model.lora.merge is not None
              else passthrough_value(plan, LORA_MERGE_KEY, "false").lower() == "true")
    if plan.rollout.name == "sglang" and plan.model.lora.enabled and not merged:
        yield ctx.violation(
            f"model.lora.rank = {plan.model.lora.rank} with the SGLang rollout: SGLang serves no adapters, so "
            "after the first sync it would receive LoRA tensors it has no place for.",
            f"merge the adapter before each sync: add {LORA_MERGE_KEY}=true to the plan's passthrough "
            "(or use the vLLM rollout)",
        )


# The vLLM engine keys verl does not pass to SGLang (sglang_rollout/async_sglang_server.py server args
# name mem_fraction_static, disable_cuda_graph, tp_size, dp_size, max_running_requests and no others of
# these), so SGLang runs its own defaults (chunked_prefill_size, radix cache) whatever the plan says.
SGLANG_IGNORED_ROLLOUT_KEYS = ("max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
                               "layered_summon")


@rule("rlplan", "[R9] vLLM-only rollout keys have no effect with SGLang")
def _sglang_ignores_vllm_keys(ctx: RuleContext) -> Iterator[Violation]:
    """verl's async_sglang_server.py builds SGLang's ServerArgs from gpu_memory_utilization
    (mem_fraction_static), enforce_eager (disable_cuda_graph), tensor/data parallel size and max_num_seqs
    (max_running_requests); chunked prefill, prefix caching and max_num_batched_tokens are vLLM arguments
    (vllm_rollout/vllm_async_server.py) that SGLang only gets through engine_kwargs.sglang.
    """
    rollout = ctx.plan.rollout
    if rollout.name != "sglang":
        return
    defaults = type(rollout)(n=rollout.n)
    changed = [key for key in SGLANG_IGNORED_ROLLOUT_KEYS if getattr(rollout, key) != getattr(defaults, key)]
    if changed:
        yield ctx.violation(
            f"rollout.{', rollout.'.join(changed)} {'is' if len(changed) == 1 else 'are'} vLLM engine arguments "
            "that verl does not pass to SGLang; SGLang runs its own defaults.",
            "set SGLang's own knobs (chunked_prefill_size, disable_radix_cache) under "
            "actor_rollout_ref.rollout.engine_kwargs.sglang in the passthrough, or drop these keys",
            severity="warning",
        )


# Where a verl script turns on SGLang's dp-attention and sets the rollout's data-parallel size.
SGLANG_DP_ATTENTION_KEY = "actor_rollout_ref.rollout.engine_kwargs.sglang.enable_dp_attention"
ROLLOUT_DP_KEY = "actor_rollout_ref.rollout.data_parallel_size"
# verl's rollout mode (sync up to v0.6.1 by default, async only from v0.7.0): rlplan keeps it as passthrough.
ROLLOUT_MODE_KEY = "actor_rollout_ref.rollout.mode"


@rule("rlplan",
      "[R9] SGLang drops dp-attention when verl's rollout data_parallel_size is 1")
def _sglang_dp_attention_needs_rollout_dp(ctx: RuleContext) -> Iterator[Violation]:
    """verl passes tp_size = tensor_model_parallel_size x data_parallel_size and dp_size =
    data_parallel_size (sglang_rollout/async_sglang_server.py), so SGLang's `tp_size % dp_size == 0`
    always holds; but SGLang's ServerArgs._handle_data_parallelism sets enable_dp_attention = False
    when dp_size == 1, silently.
    """
    wanted = passthrough_value(ctx.plan, SGLANG_DP_ATTENTION_KEY, "false").lower() == "true"
    dp_text = passthrough_value(ctx.plan, ROLLOUT_DP_KEY, "1")
    # A value rlplan cannot read (an interpolation) is not judged.
    dp = int(dp_text) if dp_text.isdigit() else None
    if ctx.plan.rollout.name == "sglang" and wanted and dp is not None and dp <= 1:
        yield ctx.violation(
            f"{SGLANG_DP_ATTENTION_KEY} is on, but the rollout's data_parallel_size is {dp}: SGLang turns "
            "dp-attention off when dp_size is 1.",
            f"set {ROLLOUT_DP_KEY} > 1 (SGLang then runs TP = tensor_model_parallel_size x data_parallel_size), "
            "or drop the key", severity="warning",
        )


# --- rlplan stage: accepted by verl, broken or wasteful in practice ------------


@rule("rlplan", "GRPO/RLOO compare n > 1 responses per prompt")
def _group_advantage_needs_samples(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.algorithm.adv_estimator in ("grpo", "rloo") and plan.rollout.n < 2:
        yield ctx.violation(
            f"{plan.algorithm.adv_estimator} normalizes rewards within each prompt's group, and rollout.n = "
            f"{plan.rollout.n} makes every advantage zero: nothing would be learned.",
            "set rollout.n >= 2 (GRPO commonly uses 5-16)", rollout__n=5,
        )
    if plan.algorithm.adv_estimator in ("grpo", "rloo") and plan.rollout.temperature == 0:
        yield ctx.violation(
            "rollout.temperature = 0 samples the same response n times, so group advantages are all zero.",
            "set rollout.temperature = 1.0", severity="warning", rollout__temperature=1.0,
        )


@rule("rlplan", "with rollout.ignore_eos every response is max_response_length tokens long")
def _ignore_eos_fills_every_response(ctx: RuleContext) -> Iterator[Violation]:
    data = ctx.plan.data
    expected = data.expected_response_length
    if ctx.plan.rollout.ignore_eos and expected is not None and expected < data.max_response_length:
        yield ctx.violation(
            f"rollout.ignore_eos samples past the end-of-sequence token, so every response is "
            f"{data.max_response_length} tokens, but data.expected_response_length = {expected} prices shorter "
            "ones: the memory and step-time predictions would be too low.",
            "unset data.expected_response_length (the maximum), or set rollout.ignore_eos = false",
            data__expected_response_length=None,
        )


@rule("rlplan",
      "an adapter-only LoRA sync (or layered summon) needs vLLM sleep level 1, which keeps the base weights")
def _adapter_sync_keeps_base_weights(ctx: RuleContext) -> Iterator[Violation]:
    rollout = ctx.plan.rollout
    keeps_base = ctx.plan.model.lora.enabled or rollout.layered_summon
    if rollout.name == "vllm" and keeps_base and rollout.free_cache_engine and rollout.sleep_level == 2:
        yield ctx.violation(
            "sleep level 2 discards vLLM's base weights, but with LoRA (or layered_summon) only adapters are pushed "
            "after the first sync; verl silently forces level 1, which keeps a host copy of the weights.",
            "set rollout.sleep_level = 1", rollout__sleep_level=1,
        )


@rule("rlplan",
      "LoRA and layered_summon expect vLLM to load the base itself (load_format = safetensors)")
def _lora_loads_base_from_disk(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.rollout.layered_summon and plan.rollout.load_format == "dummy":
        yield ctx.violation(
            "rollout.layered_summon gathers and pushes one layer at a time on top of a base vLLM loaded itself, "
            "but load_format = dummy gives vLLM random weights.",
            'set rollout.load_format = "safetensors"', rollout__load_format="safetensors",
        )
    elif plan.model.lora.enabled and plan.rollout.load_format == "dummy":
        yield ctx.violation(
            "with LoRA and load_format = dummy the first sync pushes the whole base model; verl's docs require "
            "safetensors.",
            'set rollout.load_format = "safetensors"', severity="warning", rollout__load_format="safetensors",
        )


@rule("rlplan", "the per-GPU batch is a whole number of equal mini batches")
def _mini_batches_split_evenly(ctx: RuleContext) -> Iterator[Violation]:
    for role in (ctx.layout.actor_update, ctx.layout.critic_update):
        if role is None or not role.mini_batch_size_per_gpu or role.sequences_per_gpu <= 0:
            continue
        if role.sequences_per_gpu % role.mini_batch_size_per_gpu:
            section = "actor" if role.role == Phase.ACTOR_UPDATE else "critic"
            yield ctx.violation(
                f"{role.sequences_per_gpu} sequences per GPU split into mini batches of "
                f"{role.mini_batch_size_per_gpu}: the last optimizer step sees a smaller batch.",
                f"make data.train_batch_size a multiple of {section}.ppo_mini_batch_size", severity="warning",
            )


@rule("rlplan", "[V6] a KL term in both the reward and the loss counts it twice")
def _kl_in_reward_and_loss(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.algorithm.use_kl_in_reward and plan.actor.use_kl_loss:
        yield ctx.violation(
            "both algorithm.use_kl_in_reward and actor.use_kl_loss are on; the KL penalty applies twice.",
            "turn one of them off", severity="warning",
        )


# --- platform stage: what rlplan's bundled runtime can run on this machine -----
# Run only by `rlplan run`, which passes the Platform it detected; verl plans are judged without them.


def _platform(ctx: RuleContext) -> Platform:
    assert ctx.platform is not None, "check_plan runs platform rules only with a Platform"
    return ctx.platform


# --- the Megatron backend (verl's megatron workers over Megatron-Core) -------------------------------------


def _megatron_roles(plan: Plan) -> Iterator[tuple[str, MegatronSection]]:
    """The roles verl builds with Megatron and their engines: the actor, its reference (verl defaults its
    parallel sizes to the actor's), and the critic where the plan trains one."""
    if not plan.is_megatron:
        return
    yield "actor", plan.actor.mcore
    if plan.uses_reference and not plan.reference_is_actor:
        yield "ref", plan.ref.megatron or plan.actor.mcore
    if plan.uses_critic:
        yield "critic", plan.critic.megatron or MegatronSection()


@rule("worker", "Megatron's world splits into TP x PP x CP model-parallel groups and DP replicas")
def _megatron_world_divides(ctx: RuleContext) -> Iterator[Violation]:
    """megatron/core/parallel_state.py initialize_model_parallel (called from verl's megatron_workers.py
    ActorRolloutRefWorker.__init__ via mpu.initialize_model_parallel): RuntimeError unless world_size is
    divisible by tensor x pipeline x context parallel size."""
    world = ctx.plan.cluster.world_size
    for role, engine in _megatron_roles(ctx.plan):
        group = engine.model_parallel_size * engine.context_parallel_size
        if world % group:
            yield ctx.violation(
                f"{role}: the world of {world} GPUs does not split into groups of TP {engine.tensor_model_parallel_size}"
                f" x PP {engine.pipeline_model_parallel_size} x CP {engine.context_parallel_size} = {group}.",
                f"choose {role}.megatron sizes whose product divides {world}",
            )


@rule("worker", "MoE experts split over EP x ETP: EP divides the experts, EP x ETP x PP divides the world")
def _megatron_experts_divide(ctx: RuleContext) -> Iterator[Violation]:
    """megatron/core/transformer/moe/moe_layer.py (`num_moe_experts % ep_size == 0`, each rank holds
    num_experts / EP experts) and parallel_state.initialize_model_parallel (the expert groups: world % (ETP x EP
    x PP) == 0). A dense model has no experts to split (Megatron's arguments refuse EP > 1 without experts)."""
    plan = ctx.plan
    experts, world = plan.model.arch.num_experts, plan.cluster.world_size
    for role, engine in _megatron_roles(plan):
        ep, etp = engine.expert_model_parallel_size, engine.expert_tensor_size
        if not experts and ep > 1:
            yield ctx.violation(f"{role}: expert parallel size {ep} on {plan.model.name}, which has no experts.",
                                f"set {role}.megatron.expert_model_parallel_size = 1",
                                **{f"{role}__megatron__expert_model_parallel_size": 1})
        elif experts and experts % ep:
            yield ctx.violation(f"{role}: {experts} experts do not split over expert parallel size {ep}.",
                                f"set {role}.megatron.expert_model_parallel_size to a divisor of {experts}")
        elif world % (ep * etp * engine.pipeline_model_parallel_size):
            yield ctx.violation(
                f"{role}: the world of {world} GPUs does not split into expert groups of EP {ep} x ETP {etp} x PP "
                f"{engine.pipeline_model_parallel_size}.", f"choose {role}.megatron EP and ETP whose product with PP "
                f"divides {world}")


@rule("worker", "Megatron's tensor parallelism splits attention heads and KV heads evenly")
def _megatron_heads_divide_tp(ctx: RuleContext) -> Iterator[Violation]:
    """megatron/core/transformer/attention.py (`divide(num_attention_heads, tp)`, which asserts) and
    TransformerConfig.__post_init__ (num_query_groups % tensor_model_parallel_size == 0): unlike vLLM,
    Megatron never copies KV heads across TP ranks. MLA has no KV heads to split."""
    arch = ctx.plan.model.arch
    for role, engine in _megatron_roles(ctx.plan):
        tp = engine.tensor_model_parallel_size
        kv_ok = arch.is_mla or arch.num_kv_heads % tp == 0
        if arch.num_attention_heads % tp or not kv_ok:
            yield ctx.violation(
                f"{role}: tensor parallel size {tp} does not divide {arch.num_attention_heads} attention heads"
                + ("" if arch.is_mla else f" and {arch.num_kv_heads} KV heads") + ".",
                f"set {role}.megatron.tensor_model_parallel_size to a divisor of both",
                **{f"{role}__megatron__tensor_model_parallel_size": 1})


# verl's override_transformer_config keys that place layers unevenly over pipeline stages (Megatron then
# checks the remaining layers instead); with them in the plan's passthrough the even split is not required.
UNEVEN_PIPELINE_KEYS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                        "pipeline_model_parallel_layout")


def _uneven_pipeline(plan: Plan, role: str) -> bool:
    prefix = ("critic" if role == "critic" else f"actor_rollout_ref.{role}") + ".megatron.override_transformer_config."
    return any(passthrough_value(plan, prefix + key, "") for key in UNEVEN_PIPELINE_KEYS)


@rule("worker", "the layers split evenly over PP x VPP model chunks")
def _megatron_layers_divide_pipeline(ctx: RuleContext) -> Iterator[Violation]:
    """Megatron-Core TransformerConfig / transformer_block.get_num_layers_to_build: num_layers % PP == 0, and
    with a virtual pipeline each stage's layers % VPP == 0 (ValueError at model build)."""
    layers = ctx.plan.model.arch.num_layers
    for role, engine in _megatron_roles(ctx.plan):
        chunks = engine.pipeline_model_parallel_size * (engine.virtual_pipeline_model_parallel_size or 1)
        if layers % chunks and not _uneven_pipeline(ctx.plan, role):
            yield ctx.violation(
                f"{role}: {layers} layers do not split into PP {engine.pipeline_model_parallel_size} x VPP "
                f"{engine.virtual_pipeline_model_parallel_size or 1} = {chunks} equal model chunks.",
                f"choose {role}.megatron pipeline sizes whose product divides {layers}, or place layers with "
                "override_transformer_config.num_layers_in_first_pipeline_stage",
                **{f"{role}__megatron__virtual_pipeline_model_parallel_size": None})


@rule("worker", "a virtual (interleaved) pipeline needs a pipeline")
def _megatron_vpp_needs_pipeline(ctx: RuleContext) -> Iterator[Violation]:
    """megatron/core/parallel_state.py: the interleaved schedule needs pipeline_model_parallel_size > 1."""
    for role, engine in _megatron_roles(ctx.plan):
        vpp = engine.virtual_pipeline_model_parallel_size
        if vpp is not None and vpp > 1 and engine.pipeline_model_parallel_size == 1:
            yield ctx.violation(f"{role}: virtual pipeline size {vpp} with pipeline size 1; there is no pipeline "
                                "to interleave.", f"unset {role}.megatron.virtual_pipeline_model_parallel_size",
                                **{f"{role}__megatron__virtual_pipeline_model_parallel_size": None})


@rule("runtime", "with a virtual pipeline the micro batches of a mini batch are a multiple of PP")
def _megatron_vpp_micro_batches_divide(ctx: RuleContext) -> Iterator[Violation]:
    """verl/workers/actor/megatron_actor.py forward_backward_batch and engine/megatron/transformer_impl.py:
    with VPP > 1, `len(micro_batches) % tf_config.microbatch_group_size_per_vp_stage == 0` (asserted), which
    Megatron-Core defaults to the pipeline size. Dynamic batch sizes round the count up; fixed micro batches
    must divide it themselves."""
    plan, update = ctx.plan, ctx.layout.actor_update
    engine = plan.actor.mcore
    vpp, pp = engine.virtual_pipeline_model_parallel_size, engine.pipeline_model_parallel_size
    if not plan.is_megatron or vpp is None or vpp <= 1 or update.uses_dynamic_bsz:
        return
    micro_batches = update.micro_batches_per_mini
    if micro_batches % pp:
        yield ctx.violation(
            f"the actor's mini batch of {update.chunk_size} sequences per DP rank is {micro_batches} micro batches, "
            f"not a multiple of the pipeline size {pp}, which verl asserts with a virtual pipeline.",
            "change actor.ppo_micro_batch_size_per_gpu or ppo_mini_batch_size so the micro batches per mini batch "
            f"are a multiple of {pp}, or use dynamic batch sizes")


@rule("worker", "full recompute covers at most the layers of one pipeline stage")
def _megatron_recompute_layers_fit_stage(ctx: RuleContext) -> Iterator[Violation]:
    """Megatron-Core TransformerConfig.__post_init__: with full recompute, recompute_num_layers must lie between
    1 and num_layers_per_pipeline_rank (per virtual chunk with VPP)."""
    layers = ctx.plan.model.arch.num_layers
    for role, engine in _megatron_roles(ctx.plan):
        chunks = engine.pipeline_model_parallel_size * (engine.virtual_pipeline_model_parallel_size or 1)
        per_chunk = max(layers // chunks, 1)
        if engine.recompute_granularity == "full" and (engine.recompute_num_layers or 0) > per_chunk:
            yield ctx.violation(
                f"{role}: recompute_num_layers = {engine.recompute_num_layers}, but a pipeline chunk holds "
                f"{per_chunk} layers.", f"set {role}.megatron.recompute_num_layers to at most {per_chunk}",
                **{f"{role}__megatron__recompute_num_layers": per_chunk})


@rule("config", "MoE with tensor parallelism needs sequence parallel")
def _megatron_moe_tp_needs_sequence_parallel(ctx: RuleContext) -> Iterator[Violation]:
    """Megatron-Core TransformerConfig.__post_init__: a MoE model with tensor_model_parallel_size > 1 and
    expert parallelism refuses to build without sequence_parallel (the token dispatcher expects the
    sequence-split hidden states)."""
    if not ctx.plan.model.arch.is_moe:
        return
    for role, engine in _megatron_roles(ctx.plan):
        if engine.tensor_model_parallel_size > 1 and engine.expert_model_parallel_size > 1 \
                and not engine.sequence_parallel:
            yield ctx.violation(f"{role}: MoE with TP {engine.tensor_model_parallel_size} and EP "
                                f"{engine.expert_model_parallel_size} but sequence_parallel off.",
                                f"set {role}.megatron.sequence_parallel = true",
                                **{f"{role}__megatron__sequence_parallel": True})


@rule("config", "verl's Megatron engine has megatron.grad_offload only from 0.4.0 to 0.9.0",
      applies=MEGATRON_GRAD_OFFLOAD_ABSENT)
def _megatron_grad_offload_is_not_in_verl_0_9(ctx: RuleContext) -> Iterator[Violation]:
    """verl 0.9.1 verl/workers/config/engine.py McoreEngineConfig has no grad_offload field (0.5.0-0.9.0 have it,
    and 0.4.x's ppo_megatron_trainer.yaml): hydra refuses the override, and added with `+` the dataclass raises
    TypeError. verl 0.3.0.post1's YAML has no actor.megatron.grad_offload either."""
    for role in ("actor", "critic"):
        engine = getattr(ctx.plan, role).megatron
        if ctx.plan.is_megatron and engine is not None and engine.grad_offload is not None:
            yield ctx.violation(f"{role}.megatron.grad_offload is set, a key verl {ctx.plan.stack.verl}'s Megatron "
                                "engine does not have (verl 0.4.0-0.9.0 do): hydra refuses the override.",
                                f"unset {role}.megatron.grad_offload",
                                **{f"{role}__megatron__grad_offload": None})


# peft's LoRA keys (FSDP) and Megatron-Bridge's (model.lora.*): each backend reads only its own.
PEFT_LORA_KEYS = tuple(f"actor_rollout_ref.model.{name}" for name in (
    "lora_rank", "lora_alpha", "target_modules", "exclude_modules", "lora_adapter_path"))
BRIDGE_LORA_KEYS = tuple(f"actor_rollout_ref.model.lora.{name}" for name in (
    "rank", "alpha", "target_modules", "exclude_modules", "type", "adapter_path"))


@rule("rlplan", "LoRA keys of the other backend are ignored (peft's model.lora_* vs Megatron-Bridge's model.lora.*)")
def _lora_keys_the_backend_ignores(ctx: RuleContext) -> Iterator[Violation]:
    """verl's Megatron workers build Megatron-Bridge's LoRA from model.lora.* (verl/workers/config/
    megatron_peft.py) and never read peft's model.lora_rank / lora_alpha; the FSDP workers build peft from
    model.lora_rank and read only model.lora.merge of the other namespace."""
    plan = ctx.plan
    ignored = PEFT_LORA_KEYS if plan.is_megatron else BRIDGE_LORA_KEYS
    found = [key for key in ignored if passthrough_value(plan, key, "") != ""]
    if found:
        own = "model.lora.rank / alpha / target_modules" if plan.is_megatron else "model.lora_rank / lora_alpha"
        yield ctx.violation(
            f"{', '.join(found)} {'is' if len(found) == 1 else 'are'} ignored by verl's "
            f"{'Megatron' if plan.is_megatron else 'FSDP'} workers, which read LoRA from {own}.",
            f"set the plan's model.lora fields instead and remove {found[0]} from the passthrough",
            severity="warning")


# FSDP plan fields verl's Megatron workers never read, with the value that means "unused".
FSDP_ONLY_FIELDS: dict[str, Any] = {
    "actor.param_offload": False, "actor.optimizer_offload": False, "actor.offload_policy": False,
    "actor.fsdp_size": -1, "actor.ulysses_sequence_parallel_size": 1, "ref.param_offload": False,
    "critic.param_offload": False, "critic.optimizer_offload": False, "critic.offload_policy": False,
    "critic.ulysses_sequence_parallel_size": 1, "rollout.layered_summon": False,
}


@rule("rlplan", "FSDP-only knobs on a Megatron plan do nothing")
def _fsdp_knobs_on_a_megatron_plan(ctx: RuleContext) -> Iterator[Violation]:
    """ppo_megatron_trainer.yaml has no fsdp_config, ulysses or layered-summon keys (a render leaves them out):
    offload and sequence splitting are Megatron's own knobs there (<role>.megatron.*)."""
    plan = ctx.plan
    if not plan.is_megatron:
        return
    set_fields = {name: unused for name, unused in FSDP_ONLY_FIELDS.items() if knob_value(plan, name) != unused}
    if set_fields:
        yield ctx.violation(
            f"{', '.join(set_fields)} {'is an FSDP knob' if len(set_fields) == 1 else 'are FSDP knobs'} that verl's "
            "Megatron workers never read.",
            "use the Megatron equivalents (actor.megatron.param_offload / optimizer_offload, context_parallel_size)",
            severity="warning", **{name.replace(".", "__"): unused for name, unused in set_fields.items()})


@rule("rlplan", "Megatron-Bridge LoRA targets Megatron's module names, not peft's")
def _megatron_lora_targets_megatron_modules(ctx: RuleContext) -> Iterator[Violation]:
    """Megatron-Bridge matches target_modules against Megatron module names (linear_qkv, linear_proj,
    linear_fc1, linear_fc2; the MLA projections for DeepSeek); peft's "all-linear" or q_proj names match
    nothing, leaving no adapter to train."""
    plan = ctx.plan
    lora = plan.model.lora
    if plan.is_megatron and lora.enabled and any(name == "all-linear" or name.endswith("_proj") and
                                                 not name.startswith("linear_") for name in lora.target_modules):
        mla = plan.model.arch.is_mla
        names = (["linear_kv_down_proj", "linear_kv_up_proj", "linear_q_down_proj", "linear_q_up_proj",
                  "linear_proj", "linear_fc1", "linear_fc2"] if mla
                 else ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"])
        yield ctx.violation(f"model.lora.target_modules = {list(lora.target_modules)} are peft's names; "
                            "Megatron-Bridge matches Megatron's module names.",
                            f"set model.lora.target_modules = {names}", model__lora__target_modules=tuple(names))


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
    # runtime/rollout/ drives vLLM; an SGLang plan is for verl, which starts SGLang itself.
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
    if estimator not in RUNTIME_ESTIMATORS:
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
