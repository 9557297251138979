"""The memory rules: where a plan's state lives and what its memory is priced at, as verl would run it. The loss
head it runs, FSDP2's CPU offload policy, the lengths the rollout engine is sized for and admits at once, and
the response lengths the predictions assume.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlplan.planner.memory.heads import runtime_loss_head
from rlplan.planner.plan import ENGINE_TITLES, Plan
from rlplan.planner.presets import model_presets
from rlplan.planner.rules.registry import (
    ROLLOUT_MODE_KEY,
    RuleContext,
    Violation,
    _trained_sections,
    passthrough_value,
    rule,
)
from rlplan.planner.stack import (
    BATCHED_TOKENS_RAISED,
    CHUNKED_PREFILL_NEEDS_MODEL_LEN,
    LEN_FROM_SEQUENCES,
    ROPE_SCALED_LEN_ASSERT,
    ROPE_SCALED_SKIPS_LEN_ASSERT,
    VLLM_GEMMA3_POSITIONS_PRESCALED,
    VLLM_V1_FORCES_CHUNKED_PREFILL,
    VLLM_YARN_POSITIONS_PRESCALED,
    holds,
    vllm_engine_of,
)
from rlplan.planner.verl_keys import CONTEXT_OVERRIDE_KEY, MEGATRON_CONTEXT_OVERRIDE_KEY


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


def _model_config_as_read(plan: Plan) -> str:
    """Where the plan's max_position_embeddings comes from, as far as the plan can tell: a preset's name is what the
    import writes where it priced the model from rlplan's preset (a hub id a preset lists, or a local folder that is
    not on this machine); any other name is the folder whose config.json the import read."""
    name, path = plan.model.name, plan.model.path
    if name in model_presets():
        where = f"rlplan's preset {name} (the published config.json" + (
            f"; {path} was not read on this machine)" if path else ")")
        return f"{where}: a local config.json with more positions would change this verdict"
    return f"the config.json of {path or name}"


def _context_override(plan: Plan, positions: int) -> str:
    key = MEGATRON_CONTEXT_OVERRIDE_KEY if plan.is_megatron else CONTEXT_OVERRIDE_KEY
    return f"+{key}={positions}"


@rule("runtime",
      "[R7] max_model_len <= max_position_embeddings and > max_prompt_length")
def _max_model_len_within_model(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    limit, max_len = plan.model.arch.max_position_embeddings, plan.verl_max_model_len
    sequences = plan.data.max_sequence_length
    # Before v0.7.0 verl passes prompt + response where max_model_len is unset (stack.LEN_FROM_SEQUENCES).
    from_sequences = holds(LEN_FROM_SEQUENCES, plan.stack)
    if plan.rollout.max_model_len is None and not from_sequences and plan.fitting_max_model_len < limit:
        yield ctx.violation(
            f"rollout.max_model_len is not set, so verl {plan.stack.verl} sizes {ENGINE_TITLES[plan.rollout.name]} for "
            f"max_position_embeddings = "
            f"{limit} tokens instead of the plan's sequences.",
            f"set rollout.max_model_len = {plan.fitting_max_model_len}",
            severity="warning", rollout__max_model_len=plan.fitting_max_model_len,
        )
    engine_limit = _engine_max_model_len(plan, from_sequences)
    if plan.rollout.max_model_len is not None and max_len > engine_limit:
        # vLLM's ModelConfig refuses a max_model_len above the model's positions (VLLM_ALLOW_LONG_MAX_MODEL_LEN
        # aside), rope-scaled where the config scales them; verl from v0.7.1 raises first, on the positions
        # themselves (vllm_async_server.py, verl/workers/rollout/utils.py get_max_position_embeddings).
        yield ctx.violation(
            f"rollout.max_model_len = {max_len} exceeds the model's max_position_embeddings = {engine_limit}"
            + (f" ({limit} x rope_scaling as vLLM reads it)." if engine_limit != limit else "."),
            f"set rollout.max_model_len = {plan.fitting_max_model_len}",
            rollout__max_model_len=plan.fitting_max_model_len,
        )
    if plan.data.max_prompt_length >= max_len:
        yield ctx.violation(
            f"data.max_prompt_length = {plan.data.max_prompt_length} leaves no room for a response within "
            f"max_model_len = {max_len}; vLLM rejects such prompts.",
            f"set rollout.max_model_len = {sequences}",
            rollout__max_model_len=sequences,
        )
    elif max_len < sequences and not (sequences > limit and max_len == limit):
        yield ctx.violation(
            f"max_model_len = {max_len} is shorter than prompt + response = {sequences}: long "
            "prompts get shorter responses than data.max_response_length.",
            f"set rollout.max_model_len = {plan.fitting_max_model_len}",
            severity="warning", rollout__max_model_len=plan.fitting_max_model_len,
        )
    if from_sequences:
        start = _start_up_limit(plan)
        if start is not None and sequences > start[0]:
            yield from _sequences_fail_at_start(ctx, *start)
    elif sequences > limit:
        yield from _sequences_clamped(ctx)


def _engine_max_model_len(plan: Plan, from_sequences: bool) -> int:
    """The longest rollout.max_model_len the rollout takes: vLLM's derived length (the positions, rope-scaled as
    vLLM's ModelConfig scales them: `Architecture.vllm_derived_max_model_len`) where verl hands it the length
    (before v0.7.0), else the model's positions (verl from v0.7.1 raises above them; SGLang's own check is not
    modelled and taken as the positions)."""
    if from_sequences and plan.rollout.name == "vllm":
        return vllm_derived_max_model_len(plan)
    return plan.model.arch.max_position_embeddings


def vllm_derived_max_model_len(plan: Plan) -> int:
    """vLLM's own limit on max_model_len for the plan's model, on the plan's vLLM release (the rope types whose
    positions it takes as already scaled move by release: stack.VLLM_GEMMA3_POSITIONS_PRESCALED,
    VLLM_YARN_POSITIONS_PRESCALED)."""
    return plan.model.arch.vllm_derived_max_model_len(
        gemma3_prescaled=holds(VLLM_GEMMA3_POSITIONS_PRESCALED, plan.stack),
        yarn_prescaled=holds(VLLM_YARN_POSITIONS_PRESCALED, plan.stack))


def _start_up_limit(plan: Plan) -> tuple[int, str] | None:
    """Before v0.7.0 verl starts the engine with prompt + response (stack.LEN_FROM_SEQUENCES): the longest
    prompt + response that start-up lets through, and what refuses beyond it. verl's own rollout assert, per
    release (v0.3: the positions; v0.4.x vLLM: skipped for a rope-scaled config, SGLang: the positions; v0.5-v0.6:
    positions x rope_scaling.factor: stack.ROPE_SCALED_SKIPS_LEN_ASSERT / ROPE_SCALED_LEN_ASSERT), and under it
    vLLM's ModelConfig, which refuses a max_model_len above its derived length (where rollout.max_model_len is
    set, vLLM gets that instead: the rule's rollout.max_model_len check). None: nothing refuses at start."""
    arch, engine = plan.model.arch, plan.rollout.name
    positions = arch.max_position_embeddings
    assert_text = ("its rollout asserts max_position_embeddings >= prompt_length + response_length "
                   "(vllm_rollout_spmd.py vLLMRollout.__init__; sglang_rollout.py _verify_config)")
    verl_limit: int | None = positions
    if arch.rope_scaled and holds(ROPE_SCALED_LEN_ASSERT, plan.stack):
        verl_limit = arch.rope_scaled_positions
        assert_text = (f"its rollout asserts max_position_embeddings x rope_scaling factor {arch.rope_scaling_factor:g} "
                       "= {limit} >= prompt_length + response_length (vllm_rollout_spmd.py vLLMRollout.__init__; "
                       "sglang_rollout.py _verify_config)")
    elif arch.rope_scaled and holds(ROPE_SCALED_SKIPS_LEN_ASSERT, plan.stack) and engine == "vllm":
        verl_limit = None  # verl's vLLM rollout asserts only where the config has no rope_scaling
    from_length = engine == "vllm" and plan.rollout.max_model_len is None
    engine_limit = vllm_derived_max_model_len(plan) if from_length else None
    if engine_limit is not None and (verl_limit is None or engine_limit < verl_limit):
        scaled = (f" (max_position_embeddings {positions} with rope_scaling {arch.rope_scaling_type} as vLLM "
                  f"{plan.stack.version_of('vllm')} scales it)" if arch.rope_scaled else "")
        skipped = ("its rollout skips its own positions assert for a rope-scaled config, and "
                   if verl_limit is None else "")
        return engine_limit, (f"{skipped}vLLM's ModelConfig refuses max_model_len = prompt + response above its "
                              f"derived length {engine_limit}{scaled} (vllm/config.py _get_and_verify_max_len)")
    if verl_limit is None:
        return None
    return verl_limit, assert_text.replace("{limit}", str(verl_limit))


def _sequences_fail_at_start(ctx: RuleContext, start_limit: int, refused_by: str) -> Iterator[Violation]:
    """prompt + response above what start-up lets through (`_start_up_limit`): the v0.6.x async server hands
    vLLM the same length, which vLLM's ModelConfig refuses alike, so the script fails at start."""
    plan = ctx.plan
    limit, sequences = plan.model.arch.max_position_embeddings, plan.data.max_sequence_length
    shorter = max(1, start_limit - plan.data.max_prompt_length)
    yield ctx.violation(
        f"prompt + response = {sequences} tokens exceeds the {start_limit} positions verl {plan.stack.verl} lets "
        f"through at start for the model's max_position_embeddings = {limit}, as read from "
        f"{_model_config_as_read(plan)}. verl {plan.stack.verl} gives {ENGINE_TITLES[plan.rollout.name]} prompt + "
        f"response as max_model_len and {refused_by}, so the script fails at start.",
        f"if the model takes {sequences} positions, raise its context with {_context_override(plan, sequences)} "
        f"(or edit its config.json); else set data.max_response_length = {shorter}",
        data__max_response_length=shorter,
    )


def _sequences_clamped(ctx: RuleContext) -> Iterator[Violation]:
    """From v0.7.0 verl starts vLLM at the model's positions (unscaled: verl/workers/rollout/utils.py
    get_max_position_embeddings on main, hf_config.max_position_embeddings at v0.7.0, whatever rope_scaling says)
    and the agent loop clamps each request's max_tokens to max_model_len - prompt (vllm_async_server.py
    generate, v0.7.0 line 471): the run goes on with shorter responses."""
    plan = ctx.plan
    limit, sequences = plan.model.arch.max_position_embeddings, plan.data.max_sequence_length
    yield ctx.violation(
        f"prompt + response = {sequences} tokens exceeds the model's max_position_embeddings = {limit}, as read "
        f"from {_model_config_as_read(plan)}. verl {plan.stack.verl} starts vLLM with max_model_len = {limit} and "
        f"its agent loop clamps each response to {limit} - prompt tokens (vllm_async_server.py generate), so the "
        "run goes on with responses cut short of data.max_response_length.",
        f"if the model takes {sequences} positions, raise its context with {_context_override(plan, sequences)} "
        f"(or edit its config.json); else set data.max_response_length = {limit - plan.data.max_prompt_length}",
        severity="warning", data__max_response_length=max(1, limit - plan.data.max_prompt_length),
    )


def _short_batched_tokens_refused_by(plan: Plan, verl_runs_it: bool) -> str:
    """Who refuses rollout.max_num_batched_tokens below max_model_len for this plan: "verl" (its sync vLLM rollout,
    v0.3-v0.6), "vllm" (its scheduler, without chunked prefill), "raised" (verl >= 0.9.1 raises it itself), or ""
    (nobody: chunked prefill on, or vLLM's V1 engine turning it back on). verl passes neither key to SGLang (see
    SGLANG_IGNORED_ROLLOUT_KEYS), which sizes its own chunked prefill: "" too."""
    rollout = plan.rollout
    if rollout.name != "vllm":  # TensorRT-LLM: verl passes max_num_tokens, no vLLM scheduler check
        return ""
    if verl_runs_it and not rollout.enable_chunked_prefill and vllm_engine_of(plan.stack) == "v1" and \
            holds(VLLM_V1_FORCES_CHUNKED_PREFILL, plan.stack):
        return ""  # vLLM turns chunked prefill back on, and verl's own check reads the False: nothing refuses
    sync = passthrough_value(plan, ROLLOUT_MODE_KEY, "sync").strip("'\"") != "async"
    if verl_runs_it and holds(CHUNKED_PREFILL_NEEDS_MODEL_LEN, plan.stack) and sync:
        return "verl"
    if not rollout.enable_chunked_prefill:
        return "raised" if verl_runs_it and holds(BATCHED_TOKENS_RAISED, plan.stack) else "vllm"
    return ""


def least_batched_tokens(plan: Plan) -> int:
    """The least rollout.max_num_batched_tokens that verl and vLLM start this plan's engine with (rule R8 below,
    as verl runs it): max_num_seqs, and max_model_len where something refuses less. The solver sizes it so."""
    least = plan.rollout.max_num_seqs
    if _short_batched_tokens_refused_by(plan, verl_runs_it=True) in ("verl", "vllm"):
        least = max(least, plan.verl_max_model_len)
    return least


@rule("runtime",
      "[R8] max_num_batched_tokens >= max_num_seqs, and >= max_model_len without chunked prefill")
def _batched_tokens_cover_sequences(ctx: RuleContext) -> Iterator[Violation]:
    """vLLM's scheduler check (vllm/config/scheduler.py), which vLLM's V1 engine up to 0.11.0 never meets with
    chunked prefill off: it turns it back on (stack.VLLM_V1_FORCES_CHUNKED_PREFILL)."""
    rollout = ctx.plan.rollout
    if rollout.name != "vllm":
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
    # Under `rlplan run` (a platform) neither verl nor the stack's vLLM is in the loop: the bundled runtime hands
    # both keys unchanged to its own vLLM (runtime/rollout/engine_args.py), whose scheduler refuses the pair.
    refused_by = _short_batched_tokens_refused_by(plan, verl_runs_it=ctx.platform is None)
    if refused_by == "verl":
        yield ctx.violation(
            f"rollout.max_num_batched_tokens = {rollout.max_num_batched_tokens} is below max_model_len = {max_len}: "
            f"verl {plan.stack.verl}'s sync vLLM rollout refuses it with chunked prefill on, and vLLM without.",
            f"set rollout.max_num_batched_tokens = {max_len}", rollout__max_num_batched_tokens=max_len,
        )
    elif refused_by == "raised":
        yield ctx.violation(
            f"without chunked prefill verl {plan.stack.verl} raises rollout.max_num_batched_tokens = "
            f"{rollout.max_num_batched_tokens} to max_model_len = {max_len}: vLLM's profile run (and memory) grows.",
            f"set rollout.max_num_batched_tokens = {max_len}, or rollout.enable_chunked_prefill = true",
            severity="warning", rollout__max_num_batched_tokens=max_len,
        )
    elif refused_by == "vllm":
        yield ctx.violation(
            f"without chunked prefill, rollout.max_num_batched_tokens = {rollout.max_num_batched_tokens} must hold "
            f"a whole max_model_len = {max_len} prompt.",
            "set rollout.enable_chunked_prefill = true", rollout__enable_chunked_prefill=True,
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
