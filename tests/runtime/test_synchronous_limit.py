"""benchmarks/versus_trl.py's synchronous limit (issue 42): the raw torch update it times, and the ratios it prints."""

from __future__ import annotations

import pytest

from tests.repo_scripts import load_script

versus_trl = load_script("benchmarks/versus_trl.py")


def _model():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = Qwen2ForCausalLM(config)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_raw_update_trains_on_response_tokens_only(dtype):
    """Responses move the weights; a batch with no response tokens has no loss and leaves them as they were."""
    import torch

    model, optimizer = _model()
    before = [p.detach().clone() for p in model.parameters()]
    tokens = versus_trl._raw_update_step(model, optimizer, [([1, 2, 3], []), ([4, 5], [])], dtype)
    assert tokens == 5
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    tokens = versus_trl._raw_update_step(model, optimizer, [([1, 2, 3], [7, 8]), ([4, 5], [9, 10, 11])], dtype)
    assert tokens == 10
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_rlplan_over_the_limit_is_per_phase_the_limit_has_and_for_the_step():
    sides = {"rlplan": {"seconds_per_step_median": 6.0,
                        "phase_seconds_median": {"rollout": 3.0, "actor_update": 2.0, "weight_sync": 0.5}},
             "limit": {"seconds_per_step_median": 4.0, "phase_seconds_median": {"rollout": 2.5, "actor_update": 1.5}}}
    ratios = versus_trl.limit_ratios(sides)
    assert ratios == pytest.approx({"rollout s": 1.2, "actor_update s": 2.0 / 1.5, "step s": 1.5})


@pytest.mark.parametrize("sides", ["", "trl,vllm", ","])
def test_an_unknown_side_is_a_usage_error(sides):
    with pytest.raises(SystemExit):
        versus_trl.parse_args(["--sides", sides])


def test_a_negative_warmup_is_a_usage_error():
    with pytest.raises(SystemExit):
        versus_trl.parse_args(["--warmup-steps", "-1"])


def test_the_warmup_steps_default_to_one_and_are_parsed():
    args = versus_trl.parse_args(["--steps", "3", "--warmup-steps", "2"])
    assert (args.steps, args.warmup_steps) == (3, 2)
    assert versus_trl.parse_args([]).warmup_steps == 1
