"""Memory behaviour that depends on the target stack (planner/stack.py, priced in planner/memory and layout)."""

from __future__ import annotations

import math

from rlplan.planner.knobs import apply_knobs
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.fsdp import loss_head_moment
from rlplan.planner.memory.model_facts import model_facts
from rlplan.planner.phases import Phase
from rlplan.planner.stack import StackSection
from tests.planner.plans import make_plan


def on(verl: str, **overrides):
    return make_plan(overrides=overrides or None).evolve(stack=StackSection(verl=verl))


def update_component(plan, name: str) -> int:
    return predict_memory(plan).phase(Phase.ACTOR_UPDATE).bytes_of(name)


def test_engine_workers_before_090_hold_every_earlier_micro_batchs_outputs_to_the_mini_batchs_end():
    role = plan_layout(on("0.8.0")).actor_update
    assert role.micro_batches_per_mini > 1
    expected = (role.micro_batches_per_mini - 1) * role.tokens_per_micro_batch * 4  # fp32 log-probs
    assert update_component(on("0.8.0"), "held_micro_batch_outputs") == expected
    with_entropy = on("0.8.0", **{"actor.entropy_coeff": 0.001})
    assert update_component(with_entropy, "held_micro_batch_outputs") == 2 * expected  # and fp32 entropy
    for verl in ("0.7.1", "0.9.0"):  # the legacy worker frees them; PR #6984 pops them after backward
        assert update_component(on(verl), "held_micro_batch_outputs") == 0
    assert predict_memory(on("0.8.0")).phase(Phase.ACTOR_UPDATE).peak_bytes \
        > predict_memory(on("0.9.0")).phase(Phase.ACTOR_UPDATE).peak_bytes


def test_before_0_9_1_a_token_budget_micro_batch_may_hold_one_longest_sequence_more():
    dynamic = {"actor.use_dynamic_bsz": True, "rollout.log_prob_use_dynamic_bsz": True,
               "actor.ppo_max_token_len_per_gpu": 4096}
    capped, soft = plan_layout(on("0.9.1", **dynamic)).actor_update, plan_layout(on("0.9.0", **dynamic)).actor_update
    assert capped.tokens_per_micro_batch == 4096
    assert soft.tokens_per_micro_batch == min(4096 + soft.max_sequence_length,
                                              soft.chunk_size * soft.max_sequence_length)
    assert update_component(on("0.9.0", **dynamic), "activations") > update_component(on("0.9.1", **dynamic),
                                                                                      "activations")


def test_verl_before_0_4_1_wakes_the_kv_cache_with_the_weights_whatever_the_plan_says():
    staged, unstaged = on("0.4.1"), on("0.4.0")
    assert staged.rollout.multi_stage_wake_up and unstaged.rollout.multi_stage_wake_up
    sync = Phase.WEIGHT_SYNC
    assert predict_memory(staged).phase(sync).bytes_of("kv_cache") == 0
    report = predict_memory(unstaged)
    assert report.phase(sync).bytes_of("kv_cache") > 0
    assert any("no staged wake-up" in note for note in report.notes)


def test_without_remove_padding_micro_batches_are_priced_at_padded_positions():
    means = {"data.expected_prompt_length": 100, "data.expected_response_length": 200}
    packed = plan_layout(make_plan(overrides=means)).actor_update
    padded = plan_layout(make_plan(overrides={**means, "model.use_remove_padding": False})).actor_update
    micro = packed.micro_batch_size_per_gpu
    assert packed.tokens_per_micro_batch == math.ceil(micro * 300)
    assert padded.tokens_per_micro_batch == micro * padded.max_sequence_length
    # LoRA: no root groups' backward stage (frozen lm_head), so the update peaks where the activations are.
    lora = {"model.lora.rank": 32, "rollout.load_format": "safetensors"}
    padded_plan = make_plan(overrides={**means, **lora, "model.use_remove_padding": False})
    packed_plan = apply_knobs(padded_plan, {"model.use_remove_padding": True})
    assert (predict_memory(padded_plan).phase(Phase.ACTOR_UPDATE).step_bytes
            > predict_memory(packed_plan).phase(Phase.ACTOR_UPDATE).step_bytes)


def test_a_v0_vllm_says_its_sampler_is_priced_with_v1s_coefficient():
    v0 = make_plan().evolve(stack=StackSection(vllm="0.8.3", vllm_engine="v0"))
    assert any("V0 engine" in note for note in predict_memory(v0).notes)
    # vLLM 0.8 runs V1 unless the script selects V0; 0.7 runs V0 unless it selects V1 (vllm/envs.py VLLM_USE_V1).
    assert not any("V0 engine" in note for note in predict_memory(v0.evolve(stack=StackSection(vllm="0.8.3"))).notes)
    assert any("V0 engine" in note for note in predict_memory(v0.evolve(stack=StackSection(vllm="0.7.3"))).notes)
    assert not any("V0 engine" in note for note in predict_memory(make_plan()).notes)


def _head_plan(vllm: str, **overrides):
    # verl's flash-attn head with the eager entropy: a kernel stage well above the lm_head's 2 V h.
    knobs = {"actor.entropy_coeff": 0.001, "actor.use_torch_compile": False, **overrides}
    return make_plan(overrides=knobs).evolve(stack=StackSection(vllm=vllm))


def _root_at(plan, phase: Phase) -> int:
    return predict_memory(plan).phase(phase).bytes_of("root_group_unsharded")


def test_on_torch_2_8_a_logits_head_runs_after_the_root_is_resharded_and_before_it_is_gathered_again():
    """vLLM 0.10.2 pins torch 2.8, which honours verl's explicit reshard_after_forward=True on the root: the
    head's kernel (after the forward) holds no lm_head in the no_grad pass nor at the update's loss; vLLM
    0.10.1 (torch 2.7.1) keeps the root gathered into backward."""
    lm_head = 2 * make_plan().model.arch.vocab_size * make_plan().model.arch.hidden_size
    new, old = _head_plan("0.10.2"), _head_plan("0.10.1")
    for phase in (Phase.OLD_LOG_PROB, Phase.ACTOR_UPDATE):
        assert predict_memory(new).phase(phase).peak_at in ("", "loss"), phase
        assert _root_at(new, phase) == 0, phase
        assert _root_at(old, phase) == lm_head, phase
        assert (predict_memory(old).phase(phase).step_bytes - predict_memory(new).phase(phase).step_bytes
                == lm_head + (2 * model_facts(new.model.arch).layer_params if phase == Phase.OLD_LOG_PROB else 0))


def test_the_fused_head_runs_inside_the_forward_and_is_priced_alike_on_every_stack():
    fused = {"model.use_fused_kernels": True}
    new, old = predict_memory(_head_plan("0.11.0", **fused)), predict_memory(_head_plan("0.10.1", **fused))
    for phase in (Phase.OLD_LOG_PROB, Phase.ACTOR_UPDATE):
        assert new.phase(phase) == old.phase(phase), phase
    assert new.phase(Phase.ACTOR_UPDATE).bytes_of("root_group_unsharded") > 0  # held to its post-backward


def test_a_small_head_stage_on_torch_2_8_peaks_where_the_root_is_gathered_and_keeps_it():
    """The lm_head's backward (the root gathered again by its pre-backward, the logits' gradient and the weight's)
    outweighs flash-attn's in-place head at a short micro batch: the update's loss moment keeps the root there."""
    facts = model_facts(make_plan().model.arch)
    head, root = loss_head_moment(2.0 * 256 * facts.vocab, lm_head_backward_bytes=2 * 256 * facts.vocab
                                  + 2 * facts.vocab * facts.hidden, logits_bytes=2 * 256 * facts.vocab,
                                  root_bytes=2 * facts.vocab * facts.hidden, root_gathered_at_head=False)
    assert root == 2 * facts.vocab * facts.hidden and head == 2 * 256 * facts.vocab + root
    kernel, none = loss_head_moment(20.0 * 8192 * facts.vocab, 2 * 8192 * facts.vocab, logits_bytes=2 * 8192
                                    * facts.vocab, root_bytes=root, root_gathered_at_head=False)
    assert (kernel, none) == (20.0 * 8192 * facts.vocab, 0.0)
