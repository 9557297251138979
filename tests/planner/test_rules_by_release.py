"""Each version-dependent rule fires only on the verl releases whose own code refuses (or misbehaves on) the config:
one test per rule and era (planner/stack.py behaviours, read in verl's 0.3.0.post1 ... 0.9.1 wheels)."""

from __future__ import annotations

import attrs
import pytest

from rlplan.planner.knobs import apply_knobs
from rlplan.planner.rules import RULES, check_plan
from rlplan.planner.stack import (
    AGENT_LOOP,
    ENGINE_MICRO_SPLIT_ASSERT,
    ENGINE_WORKER,
    MEGATRON_GRAD_OFFLOAD_ABSENT,
    VERL_RELEASES,
    StackSection,
)
from tests.planner.plans import make_plan

MODE_KEY = "actor_rollout_ref.rollout.mode"


def on(plan, verl: str):
    return plan.evolve(stack=StackSection(verl=verl))


def fired(plan, rule: str, severity: str = "error") -> bool:
    return any(v.rule == rule and v.severity == severity for v in check_plan(plan).violations)


def test_the_version_dependent_rules_name_their_behaviour():
    applies = {rule.name: rule.applies for rule in RULES}
    assert applies["megatron_grad_offload_is_not_in_verl_0_9"] is MEGATRON_GRAD_OFFLOAD_ABSENT
    assert applies["agent_loop_chunks_evenly"] is AGENT_LOOP
    assert applies["log_prob_micro_batch_divides_batch"] is ENGINE_MICRO_SPLIT_ASSERT
    assert applies["mini_batch_divisible_by_dp"] is ENGINE_WORKER


def _megatron_with_grad_offload():
    return make_plan(overrides={"actor.strategy": "megatron", "actor.megatron.grad_offload": True})


@pytest.mark.parametrize(("verl", "refused"), [("0.3.0.post1", True), ("0.4.0", False), ("0.5.0", False),
                                               ("0.7.0", False), ("0.8.0", False), ("0.9.0", False),
                                               ("0.9.1", True)])
def test_megatron_grad_offload_is_refused_only_where_verls_megatron_config_lacks_it(verl, refused):
    plan = on(_megatron_with_grad_offload(), verl)
    assert fired(plan, "megatron_grad_offload_is_not_in_verl_0_9") is refused


def _uneven_agent_loop(**passthrough: str):
    # 64 prompts x n 4 = 256 sequences over 6 agent-loop workers: not an even split.
    plan = make_plan(overrides={"rollout.agent_num_workers": 6})
    return plan.evolve(passthrough=dict(passthrough))


@pytest.mark.parametrize(("verl", "mode", "refused"), [
    ("0.4.1", "async", False),  # no agent loop before 0.5.0
    ("0.5.0", None, False),  # sync by default: no agent loop
    ("0.5.0", "async", True),
    ("0.6.1", "async", True),
    ("0.7.0", None, True),  # async only from 0.7.0
    ("0.9.1", None, True),
])
def test_the_agent_loop_split_is_checked_only_where_verl_runs_the_agent_loop(verl, mode, refused):
    plan = on(_uneven_agent_loop(**({MODE_KEY: mode} if mode else {})), verl)
    assert fired(plan, "agent_loop_chunks_evenly") is refused


@pytest.mark.parametrize(("verl", "refused"), [("0.3.0.post1", False), ("0.5.0", False), ("0.7.1", False),
                                               ("0.8.0", True), ("0.9.1", True)])
def test_a_log_prob_micro_batch_that_leaves_a_short_last_chunk_is_refused_only_by_the_engine_worker(verl, refused):
    # 64 x 4 / 8 = 32 sequences per GPU in micro batches of 5: the legacy worker's split() runs a short last one.
    plan = on(make_plan(overrides={"rollout.log_prob_micro_batch_size_per_gpu": 5}), verl)
    assert fired(plan, "log_prob_micro_batch_divides_batch") is refused


@pytest.mark.parametrize(("verl", "refused"), [("0.4.1", False), ("0.7.1", False), ("0.8.0", True),
                                               ("0.9.1", True)])
def test_a_mini_batch_that_does_not_split_over_dp_is_refused_only_by_the_engine_worker(verl, refused):
    # mini 3 x n 1 = 3 sequences over 8 ranks (train batch 64 keeps the dispatch even).
    plan = on(make_plan(overrides={"actor.ppo_mini_batch_size": 3, "rollout.n": 1}), verl)
    assert fired(plan, "mini_batch_divisible_by_dp") is refused


def test_before_0_7_an_unset_max_model_len_is_prompt_plus_response_and_is_not_warned_of():
    plan = make_plan(overrides={"rollout.max_model_len": None})
    old, new, v070 = on(plan, "0.6.1"), on(plan, "0.9.1"), on(plan, "0.7.0")
    assert old.verl_max_model_len == plan.data.max_sequence_length
    assert new.verl_max_model_len == plan.model.arch.max_position_embeddings
    assert not fired(old, "max_model_len_within_model", "warning")
    assert fired(new, "max_model_len_within_model", "warning")
    # verl 0.7.0's server sets the model's context whatever rollout.max_model_len says.
    assert on(make_plan(), "0.7.0").verl_max_model_len == plan.model.arch.max_position_embeddings
    assert fired(v070, "max_model_len_within_model", "warning")


def _beyond_the_models_positions(verl: str, name: str = "qwen2.5-math-7b", **overrides):
    # prompt + response 1536 on a model of 1024 positions (the DAPO Qwen2.5-Math-7B case: 10240 on 4096).
    plan = make_plan(overrides={"rollout.max_model_len": None, **overrides})
    arch = attrs.evolve(plan.model.arch, max_position_embeddings=1024)
    model = attrs.evolve(plan.model, name=name, path="/data/Qwen2.5-Math-7B", arch=arch)
    return on(plan.evolve(model=model), verl)


@pytest.mark.parametrize("verl", ["0.3.0.post1", "0.4.1", "0.6.1"])
def test_before_0_7_sequences_beyond_the_models_positions_are_refused_as_verls_rollout_asserts(verl):
    plan = _beyond_the_models_positions(verl)
    errors = [v for v in check_plan(plan).errors if v.rule == "max_model_len_within_model"]
    assert len(errors) == 1  # one cause, one error (verl sizes vLLM for prompt + response: the same length)
    assert "vllm_rollout_spmd.py" in errors[0].message and f"rlplan's preset {plan.model.name}" in errors[0].message
    assert "a local config.json with more positions would change this verdict" in errors[0].message
    assert "+actor_rollout_ref.model.override_config.max_position_embeddings=1536" in errors[0].fix
    read_here = _beyond_the_models_positions(verl, name="Qwen2.5-Math-7B")  # the folder's own config.json
    assert any("the config.json of /data/Qwen2.5-Math-7B" in v.message and "would change" not in v.message
               for v in check_plan(read_here).errors)
    megatron = _beyond_the_models_positions(verl, **{"actor.strategy": "megatron"})
    assert any("override_config.model_config.max_position_embeddings=1536" in v.fix
               for v in check_plan(megatron).errors if v.rule == "max_model_len_within_model")


def _rope_scaled(verl: str, kind: str, factor: float, original: int = 0, engine: str = "vllm"):
    """prompt + response 1536 on a model of 1024 positions whose config.json has rope_scaling."""
    plan = _beyond_the_models_positions(verl, **({"rollout.name": "sglang"} if engine == "sglang" else {}))
    arch = attrs.evolve(plan.model.arch, rope_scaling_type=kind, rope_scaling_factor=factor,
                        rope_original_max_position_embeddings=original)
    return plan.evolve(model=attrs.evolve(plan.model, arch=arch))


def _start_up_errors(plan) -> list:
    return [v for v in check_plan(plan).errors if v.rule == "max_model_len_within_model"]


@pytest.mark.parametrize(("verl", "engine", "refused"), [
    ("0.3.0.post1", "vllm", True),   # asserts the positions for every model
    ("0.4.1", "vllm", False),        # skips its assert for a rope-scaled config; vLLM scales linear to 2048
    ("0.4.1", "sglang", True),       # SGLang's _verify_config asserts the positions whatever rope_scaling says
    ("0.5.0", "vllm", False),        # asserts 1024 x 2 = 2048 >= 1536
    ("0.6.1", "sglang", False),
])
def test_before_0_7_a_linear_rope_scaled_model_is_held_to_each_releases_own_start_up_check(verl, engine, refused):
    plan = _rope_scaled(verl, "linear", 2.0, engine=engine)
    assert bool(_start_up_errors(plan)) is refused
    assert _start_up_errors(_beyond_the_models_positions(verl))  # the same model without rope_scaling: refused


@pytest.mark.parametrize("verl", ["0.4.1", "0.5.0", "0.6.1"])
def test_vllm_refuses_what_verl_lets_through_where_it_does_not_scale_the_positions(verl):
    # Llama 3's rope type is already scaled in max_position_embeddings: vLLM's ModelConfig keeps 1024, while verl
    # 0.4.x skips its assert and 0.5-0.6 assert 1024 x 8. YaRN is counted from original_max_position_embeddings.
    for plan in (_rope_scaled(verl, "llama3", 8.0, 256), _rope_scaled(verl, "yarn", 4.0, 256)):
        [error] = _start_up_errors(plan)
        assert "vLLM's ModelConfig refuses" in error.message and "1024" in error.message
        assert error.suggested == {"data.max_response_length": 512}


@pytest.mark.parametrize("verl", ["0.7.0", "0.9.1"])
def test_from_0_7_rope_scaling_does_not_lift_the_positions_verl_starts_vllm_at(verl):
    plan = _rope_scaled(verl, "linear", 2.0)
    assert not _start_up_errors(plan)
    assert any("vllm_async_server.py generate" in v.message
               for v in check_plan(plan).warnings if v.rule == "max_model_len_within_model")


@pytest.mark.parametrize("verl", ["0.7.0", "0.8.0", "0.9.1"])
def test_from_0_7_verl_runs_sequences_beyond_the_models_positions_with_responses_cut_so_it_is_a_warning(verl):
    # verl starts vLLM at the model's positions and clamps max_tokens to max_model_len - prompt (agent loop).
    plan = _beyond_the_models_positions(verl)
    assert not fired(plan, "max_model_len_within_model")
    warnings = [v for v in check_plan(plan).warnings if v.rule == "max_model_len_within_model"]
    assert len(warnings) == 1 and "vllm_async_server.py generate" in warnings[0].message


def test_a_long_context_model_with_a_short_run_needs_no_long_batched_tokens_before_0_7():
    # max_num_batched_tokens 8192 < the model's 32768 context, > prompt + response 1536: verl <= 0.6 passes the latter.
    plan = make_plan(overrides={"rollout.max_model_len": None, "rollout.max_num_batched_tokens": 8192,
                                "rollout.enable_chunked_prefill": False})
    assert not fired(on(plan, "0.6.1"), "batched_tokens_cover_sequences")
    assert fired(on(plan, "0.9.0"), "batched_tokens_cover_sequences")  # vLLM 0.18 keeps chunked prefill off
    assert fired(on(plan, "0.9.1"), "batched_tokens_cover_sequences", "warning")


def test_vllms_v1_engine_up_to_0_11_0_turns_chunked_prefill_back_on_so_short_batched_tokens_pass():
    # verl 0.7.0-0.8.0 hand vLLM the model's whole context (32768) with chunked prefill off and 8192 batched
    # tokens; vLLM 0.11.0's V1 engine sets enable_chunked_prefill = True itself, so nothing refuses. Its V0 engine
    # (vLLM 0.10.x and older, VLLM_USE_V1=0) keeps the False and refuses.
    plan = make_plan(overrides={"rollout.max_model_len": None, "rollout.max_num_batched_tokens": 8192,
                                "rollout.enable_chunked_prefill": False})
    for verl in ("0.7.0", "0.8.0"):
        assert not fired(on(plan, verl), "batched_tokens_cover_sequences")
    v0 = plan.evolve(stack=StackSection(verl="0.8.0", vllm="0.10.1", vllm_engine="v0"))
    assert fired(v0, "batched_tokens_cover_sequences")
    # Below max_num_seqs vLLM's scheduler refuses whatever the engine does with chunked prefill.
    few = apply_knobs(plan, {"rollout.max_num_batched_tokens": 128, "rollout.max_num_seqs": 256})
    assert fired(on(few, "0.8.0"), "batched_tokens_cover_sequences")


def test_verl_before_0_7_refuses_batched_tokens_below_max_model_len_with_chunked_prefill_on_in_sync_mode():
    plan = make_plan(overrides={"rollout.max_num_batched_tokens": 1024, "rollout.enable_chunked_prefill": True})
    violation = next(v for v in check_plan(on(plan, "0.5.0")).errors if v.rule == "batched_tokens_cover_sequences")
    assert violation.suggested == {"rollout.max_num_batched_tokens": 1536}
    assert not fired(apply_knobs(on(plan, "0.5.0"), violation.suggested), "batched_tokens_cover_sequences")
    # The async server (rollout.mode=async, 0.5-0.6) and verl 0.7 on hand chunked prefill to vLLM, which takes it.
    assert not fired(on(plan.evolve(passthrough={MODE_KEY: "async"}), "0.5.0"), "batched_tokens_cover_sequences")
    assert not fired(on(plan, "0.9.1"), "batched_tokens_cover_sequences")


@pytest.mark.parametrize("verl", VERL_RELEASES)
def test_a_plan_valid_on_every_release_stays_valid_on_each(verl):
    # The reference's micro batch set: verl before 0.4 always builds the reference (main_ppo maps Role.RefPolicy
    # unconditionally), and _validate_config then needs its micro batch (log_prob_micro_batch_exactly_one).
    plan = make_plan(overrides={"ref.log_prob_micro_batch_size_per_gpu": 4})
    assert check_plan(on(plan, verl)).valid


def test_verl_before_0_4_refuses_a_plan_without_the_reference_micro_batch_it_always_runs():
    assert check_plan(on(make_plan(), "0.4.1")).valid
    assert fired(on(make_plan(), "0.3.0.post1"), "log_prob_micro_batch_exactly_one")


@pytest.mark.parametrize(("verl", "vllm", "rank", "refused"), [
    ("0.4.1", "0.8.5", 48, True),  # passed as max_lora_rank=48: not one of vLLM's ranks
    ("0.4.1", "0.8.5", 64, False),
    ("0.4.1", "0.8.5", 320, False),
    ("0.4.1", "0.7.3", 320, True),  # vLLM 0.7.3 takes up to 256
    ("0.6.0", "0.8.5", 48, True),
    ("0.6.1", "0.8.5", 48, False),  # verl rounds it up to 64 from 0.6.1
    ("0.9.1", None, 48, False),
])
def test_a_lora_rank_vllm_does_not_take_is_refused_only_where_verl_passes_it_unrounded(verl, vllm, rank, refused):
    plan = make_plan(overrides={"model.lora.rank": rank, "rollout.load_format": "safetensors"})
    plan = plan.evolve(stack=StackSection(verl=verl, vllm=vllm))
    assert fired(plan, "lora_rank_is_one_vllm_takes") is refused
    if refused:
        fix = next(v for v in check_plan(plan).errors if v.rule == "lora_rank_is_one_vllm_takes").suggested
        assert not fired(apply_knobs(plan, fix), "lora_rank_is_one_vllm_takes")


@pytest.mark.parametrize(("verl", "opted_in", "refused"), [
    ("0.7.1", False, False), ("0.7.1", True, True), ("0.7.0", True, True), ("0.6.1", True, False),
    ("0.8.0", False, True)])
def test_verl_0_7s_engine_worker_opt_in_brings_its_asserts(verl, opted_in, refused):
    # trainer.use_legacy_worker_impl=disable runs the engine worker for the actor in v0.7.x (main_ppo.py); in
    # v0.5-v0.6 it only swaps the critic's worker.
    plan = on(make_plan(overrides={"actor.ppo_mini_batch_size": 3, "rollout.n": 1}), verl)
    if opted_in:
        plan = plan.evolve(passthrough={"trainer.use_legacy_worker_impl": "disable"})
    assert fired(plan, "mini_batch_divisible_by_dp") is refused


@pytest.mark.parametrize(("verl", "refused"), [("0.7.0", False), ("0.7.1", True)])
def test_the_micro_split_assert_arrived_in_0_7_1s_engine_worker(verl, refused):
    plan = on(make_plan(overrides={"rollout.log_prob_micro_batch_size_per_gpu": 5}), verl)
    plan = plan.evolve(passthrough={"trainer.use_legacy_worker_impl": "disable"})
    assert fired(plan, "log_prob_micro_batch_divides_batch") is refused


@pytest.mark.parametrize(("verl", "refused"), [("0.3.0.post1", True), ("0.4.1", True), ("0.5.0", False),
                                                ("0.9.1", False)])
def test_prompts_that_do_not_split_over_the_gpus_are_refused_only_where_verl_dispatches_them_unrepeated(verl,
                                                                                                       refused):
    # 12 prompts x n 4 = 48 sequences split over 8 GPUs; the 12 prompts themselves do not (verl < 0.5 sends them).
    plan = on(make_plan(overrides={"data.train_batch_size": 12, "rollout.n": 4, "actor.ppo_mini_batch_size": 4,
                                   "actor.ppo_micro_batch_size_per_gpu": 1, "rollout.log_prob_micro_batch_size_per_gpu": 1,
                                   "ref.log_prob_micro_batch_size_per_gpu": 1}), verl)
    assert plan.cluster.world_size == 8
    assert fired(plan, "prompts_dispatch_divisible_by_world") is refused


@pytest.mark.parametrize(("verl", "refused"), [("0.3.0.post1", True), ("0.5.0", True), ("0.6.0", False),
                                                ("0.9.1", False)])
def test_a_real_batch_that_does_not_split_over_the_gpus_is_refused_under_dynamic_bsz_only_before_0_6(verl, refused):
    # 9 prompts x n 4 = 36 sequences over 8 GPUs: verl < 0.6's _validate_config asserts it whatever dynamic bsz says.
    plan = on(make_plan(overrides={"data.train_batch_size": 9, "rollout.n": 4, "actor.ppo_mini_batch_size": 9,
                                   "actor.use_dynamic_bsz": True, "rollout.log_prob_use_dynamic_bsz": True}), verl)
    assert fired(plan, "real_batch_divisible_by_world") is refused


@pytest.mark.parametrize(("verl", "refused"), [("0.3.0.post1", False), ("0.7.0", False), ("0.8.0", True),
                                                ("0.9.1", True)])
def test_a_global_micro_batch_key_alone_is_refused_only_by_the_engine_worker_that_does_not_read_it(verl, refused):
    plan = on(apply_knobs(make_plan(), {"actor.ppo_micro_batch_size": 16, "actor.ppo_micro_batch_size_per_gpu": None}),
              verl)
    assert fired(plan, "deprecated_global_micro_batch_keys") is refused
    assert fired(plan, "deprecated_global_micro_batch_keys", "warning") is not refused


@pytest.mark.parametrize("verl", ["0.7.0", "0.8.0"])
def test_one_sequence_over_eight_agent_loop_workers_is_refused_naming_verls_chunk_assert(verl):
    # verl's 1-GPU LoRA tuning scripts (examples/tuning/*/qwen2-*_grpo-lora_1_h100_fsdp_vllm.sh): batch 1 x n 1, and
    # from 0.7.0 every rollout goes through the agent loop's 8 workers (prompts.chunk(8) on 1 sequence).
    plan = on(make_plan(overrides={"data.train_batch_size": 1, "rollout.n": 1, "actor.ppo_mini_batch_size": 1,
                                   "rollout.agent_num_workers": 8}), verl)
    refusal = next(v for v in check_plan(plan).errors if v.rule == "agent_loop_chunks_evenly")
    assert "agent_loop.py" in refusal.message and "protocol.py" in refusal.message
    assert refusal.suggested == {"rollout.agent_num_workers": 1}


@pytest.mark.parametrize(("verl", "megatron_refused"), [("0.3.0.post1", True), ("0.4.1", False), ("0.6.1", False),
                                                        ("0.7.0", False), ("0.8.0", True)])
def test_a_micro_batch_that_does_not_divide_the_mini_batch_is_refused_by_fsdp_always_and_megatron_per_release(
        verl, megatron_refused):
    # mini 8 x n 4 / 8 ranks = 4 sequences per GPU in micro batches of 8: verl's FSDP worker asserts at start (and
    # the engine worker's prepare_micro_batches from 0.8.0); its Megatron actor asserts only at v0.3
    # (split_dict_tensor_into_batches), and from v0.4.0 runs one micro batch of 4 (batch.split).
    knobs = {"actor.ppo_mini_batch_size": 8, "rollout.n": 4, "actor.ppo_micro_batch_size_per_gpu": 8}
    assert fired(on(make_plan(overrides=knobs), verl), "actor_micro_batch_divides_mini")
    megatron = on(make_plan(overrides={"actor.strategy": "megatron", **knobs}), verl)
    assert fired(megatron, "actor_micro_batch_divides_mini") is megatron_refused


@pytest.mark.parametrize(("vllm", "refused"), [
    ("0.7.3", False),  # scales every rope type but su / longrope / llama3: 1024 x 8
    ("0.8.5", True),   # from 0.8.0 a Gemma 3 config's positions stand as they are: 1024
])
def test_vllm_from_0_8_takes_a_gemma3_configs_positions_unscaled_where_verl_0_5_asserts_them_scaled(vllm, refused):
    plan = _rope_scaled("0.5.0", "linear", 8.0)
    gemma = attrs.evolve(plan.model.arch, family="gemma3")
    plan = plan.evolve(model=attrs.evolve(plan.model, arch=gemma), stack=StackSection(verl="0.5.0", vllm=vllm))
    errors = _start_up_errors(plan)
    assert bool(errors) is refused
    if refused:
        assert "derived length 1024" in errors[0].message and f"as vLLM {vllm} scales it" in errors[0].message
    assert not _start_up_errors(plan.evolve(model=attrs.evolve(plan.model, arch=attrs.evolve(gemma, family="qwen2"))))
