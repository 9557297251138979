"""Ulysses on two gloo ranks: the split forward and backward equal the unsplit ones."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.runtime


def _micro_batch():
    import torch

    from rlplan.runtime.trainer.token_batch import token_batch_from_sequences

    generator = torch.Generator().manual_seed(7)
    # 3 + 4 + 6 prompt tokens and 5 + 2 + 5 response tokens: 25 in all, odd, so the split pads.
    prompts = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (3, 4, 6)]
    responses = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (5, 2, 5)]
    return token_batch_from_sequences(prompts, responses)


def _tiny_gqa_model():
    """One KV head for two ranks: the path that copies KV heads before the all-to-all."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    return Qwen2ForCausalLM(config).float()


def _split_versus_whole(rank: int, world_size: int, model_dir: str | None) -> dict:
    import copy

    import torch
    import torch.distributed as dist

    from rlplan.runtime.trainer.forward import ForwardOptions, policy_forward, value_forward
    from rlplan.runtime.trainer.model import load_hf_model
    from rlplan.runtime.trainer.sequence_parallel import new_sequence_parallel_group, use_ulysses_attention

    group = new_sequence_parallel_group(world_size, 2, rank)
    if model_dir is None:
        whole = _tiny_gqa_model()
    else:
        whole = load_hf_model(model_dir, value_head=False, train_dtype=torch.float32)
    split = copy.deepcopy(whole)
    use_ulysses_attention(split, 2)
    micro = _micro_batch()
    mask = micro.response_mask
    device = torch.device("cpu")
    plain = ForwardOptions(remove_padding=True)
    parallel = ForwardOptions(remove_padding=True, sequence_parallel=group)

    log_probs, entropy = policy_forward(whole, micro, device, plain, with_entropy=True)
    split_log_probs, split_entropy = policy_forward(split, micro, device, parallel, with_entropy=True)
    ((log_probs + 0.1 * entropy) * mask).sum().backward()
    ((split_log_probs + 0.1 * split_entropy) * mask).sum().backward()
    # What FSDP does with the group's partial gradients: the mean over all ranks.
    grad_error = 0.0
    for p, q in zip(whole.parameters(), split.parameters(), strict=True):
        mean = q.grad.clone()
        dist.all_reduce(mean)
        mean /= world_size
        grad_error = max(grad_error, float((mean - p.grad).abs().max() / p.grad.abs().max().clamp(min=1e-12)))
    with torch.no_grad():
        values = value_forward(whole, micro, device, plain)
        split_values = value_forward(split, micro, device, parallel)
    return {
        "log_prob_error": float(((log_probs - split_log_probs).abs() * mask).max()),
        "entropy_error": float(((entropy - split_entropy).abs() * mask).max()),
        "value_error": float(((values - split_values).abs() * mask).max()),
        "relative_grad_error": grad_error,
        "log_prob_mean": float((log_probs * mask).sum() / mask.sum()),
    }


@pytest.mark.parametrize("model", ["tiny", "one_kv_head"])
def test_ulysses_split_forward_and_backward_equal_the_whole_sequence(tiny_model_dir, model):
    from rlplan.runtime.trainer.local_group import run_on_local_group

    results = run_on_local_group(_split_versus_whole, 2, tiny_model_dir if model == "tiny" else None)
    for result in results:
        assert result["log_prob_error"] < 1e-4, result
        assert result["entropy_error"] < 1e-4, result
        assert result["value_error"] < 1e-4, result
        assert result["relative_grad_error"] < 1e-4, result
        assert result["log_prob_mean"] < -1.0  # real scores, not zeros that would match trivially


def test_a_group_size_that_splits_no_heads_is_refused():
    from types import SimpleNamespace

    from rlplan.runtime.trainer.sequence_parallel import check_heads_divide

    check_heads_divide(SimpleNamespace(num_attention_heads=4, num_key_value_heads=1), 2)
    with pytest.raises(ValueError, match="does not split 4 attention heads"):
        check_heads_divide(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), 3)
