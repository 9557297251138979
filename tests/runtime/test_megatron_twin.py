"""runtime/megatron_twin.py: Megatron-Core's own step on the CPU (needs megatron-core; skipped without it)."""

from __future__ import annotations

import pytest

from rlplan.planner.memory.megatron import optimizer_step_bytes, state_on_most_loaded_rank
from rlplan.runtime.megatron_twin import TwinCase, TwinModel


def test_a_case_round_trips_through_its_json_and_prices_as_the_planners_architecture():
    case = TwinCase("moe", TwinModel(experts=8, top_k=2, moe_ffn=256), world=4, tp=2, ep=4, recompute="full")
    assert TwinCase.from_json(case.as_json()) == case
    arch, engine = case.model.architecture(), case.engine()
    assert arch.is_moe and arch.num_experts_per_token == 2
    assert engine.sequence_parallel and engine.expert_tensor_size == 1 and engine.recompute_method == "uniform"


def test_the_twins_state_is_megatrons_buffers_and_its_optimizer_step_the_foreach_sqrt_buffer():
    """One rank of a two-layer model: the persistent state the tracker sees before the step is the DDP
    buffers' bf16 weights and fp32 grads and the optimizer's fp32 main params and moments, as the planner
    prices them; the foreach AdamW step adds its sqrt(exp_avg_sq) buffer, 4 bytes a parameter."""
    pytest.importorskip("megatron.core")
    from rlplan.runtime.megatron_twin import measure

    case = TwinCase("tiny", TwinModel(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=512), world=1,
                    seq=128, micro_batches=1)
    (rank,) = measure(case, timeout_s=600)
    parts = rank["parts"]
    state = state_on_most_loaded_rank(case.model.architecture(), case.engine(), case.world)
    assert parts["weights"] == pytest.approx(state.weights, rel=0.01)
    assert parts["grads"] == pytest.approx(state.grads, rel=0.01)
    assert parts["main_params"] + parts["moments"] == pytest.approx(state.optimizer, rel=0.01)
    assert rank["state"] == pytest.approx(sum(parts.values()), rel=0.02)
    step = rank["peaks"]["optimizer"] - rank["state"]
    assert step == pytest.approx(optimizer_step_bytes(state.largest_optimizer, foreach=case.foreach), rel=0.05)


@pytest.mark.parametrize("log_prob, per_token_vocab", [("entropy", 8), ("log_probs", 6)])
def test_the_twins_log_prob_pass_holds_megatrons_fp32_logits_beside_the_bf16_ones_and_their_clone_for_the_entropy(
        log_prob, per_token_vocab):
    """verl's no-grad log-prob pass on one rank: above the state it holds the bf16 logits, Megatron-Core's fp32
    copy of them in its cross entropy and, with the entropy, verl's clone (planner forward_pass_bytes)."""
    pytest.importorskip("megatron.core")
    from rlplan.planner.memory.megatron import forward_pass_bytes
    from rlplan.runtime.megatron_twin import measure

    case = TwinCase("tiny", TwinModel(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=4096), world=1,
                    seq=256, micro_batches=1, log_prob=log_prob)
    (rank,) = measure(case, timeout_s=600)
    _, head = forward_pass_bytes(case.model.architecture(), tp=1, tokens=case.seq, head_bytes_per_token_vocab=0.0,
                                 vocab_parallel_head=True, logits_cloned=log_prob == "entropy")
    assert head == per_token_vocab * case.seq * 4096
    assert rank["peaks"]["log_prob"] - rank["state"] == pytest.approx(head, rel=0.05)
