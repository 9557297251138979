"""Per-sequence (varlen) attention equals sdpa over the block-diagonal causal mask, values and gradients."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.runtime

# fp32 on every CPU ISA: the two paths sum the same products in different blockings (seen: 6e-7).
TOLERANCE = {"atol": 2e-5, "rtol": 1e-4}


def block_diagonal_causal_mask(positions):
    """(1, 1, S, S) bool, the reference: token i sees j when both are in one sequence and j <= i."""
    import torch

    sequence_ids = torch.cumsum((positions == 0).long(), dim=0)
    index = torch.arange(positions.shape[0])
    causal = index.unsqueeze(1) >= index.unsqueeze(0)
    return (causal & (sequence_ids.unsqueeze(1) == sequence_ids.unsqueeze(0)))[None, None]


def test_sequence_starts_come_from_positions_restarting_at_zero():
    import torch

    from rlplan.runtime.trainer.varlen_attention import cu_seqlens_from_positions

    assert cu_seqlens_from_positions(torch.tensor([[0, 1, 2, 0, 1, 0]])) == [0, 3, 5, 6]
    assert cu_seqlens_from_positions(torch.tensor([0, 1, 2, 3])) == [0, 4]
    # A stream that starts mid-sequence still begins a slice at 0.
    assert cu_seqlens_from_positions(torch.tensor([4, 5, 0, 1])) == [0, 2, 4]


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_varlen_attention_equals_the_masked_attention_in_values_and_gradients(kv_heads):
    import torch
    import torch.nn.functional as F

    from rlplan.runtime.trainer.varlen_attention import varlen_sdpa

    generator = torch.Generator().manual_seed(11)
    lengths = [5, 1, 9, 3, 12]
    positions = torch.cat([torch.arange(n) for n in lengths])
    total = positions.shape[0]
    cu_seqlens = [0, *torch.tensor(lengths).cumsum(0).tolist()]

    def tensors():
        q = torch.randn(1, 4, total, 16, generator=generator)
        k = torch.randn(1, kv_heads, total, 16, generator=generator)
        v = torch.randn(1, kv_heads, total, 16, generator=generator)
        return q, k, v

    inputs = tensors()
    grad_out = torch.randn(1, 4, total, 16, generator=generator)
    varlen = [x.clone().requires_grad_() for x in inputs]
    masked = [x.clone().requires_grad_() for x in inputs]
    out = varlen_sdpa(*varlen, cu_seqlens, scale=0.3)
    repeats = 4 // kv_heads
    key, value = (x.repeat_interleave(repeats, dim=1) for x in masked[1:])
    reference = F.scaled_dot_product_attention(
        masked[0], key, value, attn_mask=block_diagonal_causal_mask(positions), scale=0.3
    )
    (out * grad_out).sum().backward()
    (reference * grad_out).sum().backward()
    torch.testing.assert_close(out, reference, **TOLERANCE)
    for mine, theirs in zip(varlen, masked, strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, **TOLERANCE)
    # Not trivially equal: attending across the packed sequences changes the output.
    leaky = F.scaled_dot_product_attention(inputs[0], *(x.repeat_interleave(repeats, dim=1) for x in inputs[1:]),
                                           is_causal=True, scale=0.3)
    assert float((leaky - reference).detach().abs().max()) > 1e-2


def _micro_batch():
    import torch

    from rlplan.runtime.trainer.token_batch import token_batch_from_sequences

    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (3, 7, 2, 5)]
    responses = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (6, 2, 9, 4)]
    return token_batch_from_sequences(prompts, responses)


def test_packed_log_probs_with_varlen_attention_equal_the_padded_and_the_masked_ones():
    import copy

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlplan.runtime.trainer.forward import ForwardOptions, policy_forward
    from rlplan.runtime.trainer.varlen_attention import ATTENTION_IMPLEMENTATION, use_varlen_attention

    torch.manual_seed(3)
    config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, attn_implementation="sdpa")
    masked_model = Qwen2ForCausalLM(config).float()
    varlen_model = copy.deepcopy(masked_model)
    use_varlen_attention(varlen_model)
    assert varlen_model.config._attn_implementation == ATTENTION_IMPLEMENTATION
    micro = _micro_batch()
    mask = micro.response_mask
    device = torch.device("cpu")
    packed = ForwardOptions(remove_padding=True)
    padded = ForwardOptions(remove_padding=False)

    varlen_log_probs, varlen_entropy = policy_forward(varlen_model, micro, device, packed, with_entropy=True)
    masked_log_probs, masked_entropy = policy_forward(masked_model, micro, device, packed, with_entropy=True)
    with torch.no_grad():
        padded_log_probs, _ = policy_forward(varlen_model, micro, device, padded, with_entropy=False)
    torch.testing.assert_close(varlen_log_probs * mask, masked_log_probs * mask, **TOLERANCE)
    torch.testing.assert_close(varlen_entropy * mask, masked_entropy * mask, **TOLERANCE)
    torch.testing.assert_close(varlen_log_probs.detach() * mask, padded_log_probs * mask, **TOLERANCE)
    assert float((varlen_log_probs.detach() * mask).sum() / mask.sum()) < -1.0  # real scores, not zeros

    ((varlen_log_probs + 0.1 * varlen_entropy) * mask).sum().backward()
    ((masked_log_probs + 0.1 * masked_entropy) * mask).sum().backward()
    for (name, mine), theirs in zip(varlen_model.named_parameters(), masked_model.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, **TOLERANCE, msg=lambda text, name=name: f"{name}: {text}")


def test_the_trainer_uses_varlen_attention_only_for_packed_inputs_on_cpu():
    from types import SimpleNamespace

    from rlplan.runtime.trainer.role_model import use_packed_attention
    from rlplan.runtime.trainer.varlen_attention import ATTENTION_IMPLEMENTATION

    chosen = []
    model = SimpleNamespace(set_attn_implementation=chosen.append)
    use_packed_attention(model, remove_padding=True, device_type="cpu", sequence_parallel=None)
    use_packed_attention(model, remove_padding=False, device_type="cpu", sequence_parallel=None)
    use_packed_attention(model, remove_padding=True, device_type="cuda", sequence_parallel=None)
    assert chosen == [ATTENTION_IMPLEMENTATION]
