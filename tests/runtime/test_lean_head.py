"""The runtime's lean head computes what the naive fp32 head computes, and holds far less."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlplan.runtime.algorithms import entropy_from_logits, lean_head, log_probs_from_logits  # noqa: E402
from rlplan.runtime.algorithms.lean_head import (  # noqa: E402
    chunked_log_probs_and_entropy,
    lean_log_probs_and_entropy,
)

pytestmark = pytest.mark.runtime

# Both heads reduce in fp32; only the order of the fp32 sums differs with the CPU's vector width
# (AVX2 / AVX-512 / AMX), a few fp32 ulps on values of magnitude log(vocab).  A bf16 gradient is the
# rounding of two fp32 values that close, so it may differ by one bf16 ulp (2**-8 relative); the
# entropy's gradient is a difference of terms, so near zero the ulp is that of the gradient's scale.
FP32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def _fp32_gradient_tolerance(reference):
    """fp32 logits gradients sum a 1000-wide softmax in another order per kernel: an error of a few ulps of the
    gradient's scale, not of each element (one element of 0.81 once differed by 2.4e-5 on an AMD EPYC, where the
    largest gradient was 3.5)."""
    return {"rtol": 1e-5, "atol": 2**-16 * max(1.0, float(reference.abs().max()))}


def _bf16_gradient_tolerance(reference):
    return {"rtol": 2**-7, "atol": 2**-8 * float(reference.abs().max())}


def _naive(logits, labels, with_entropy):
    log_probs = log_probs_from_logits(logits, labels)
    return log_probs, entropy_from_logits(logits) if with_entropy else None


def _outputs_and_gradient(head, logits, labels, with_entropy, weights):
    logits = logits.detach().clone().requires_grad_(True)
    log_probs, entropy = head(logits, labels, with_entropy)
    loss = (weights[0] * log_probs).sum()
    if entropy is not None:
        loss = loss + (weights[1] * entropy).sum()
    loss.backward()
    return log_probs.detach(), None if entropy is None else entropy.detach(), logits.grad


def _lean(logits, labels, with_entropy):
    return chunked_log_probs_and_entropy(logits, labels, with_entropy=with_entropy)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_entropy", [False, True], ids=["log-probs", "with-entropy"])
@pytest.mark.parametrize("rows", [1, 37, 300], ids=["one-row", "uneven-chunks", "many-rows"])
def test_lean_head_equals_the_naive_head_in_values_and_gradients(dtype, with_entropy, rows):
    generator = torch.Generator().manual_seed(rows)
    logits = (3 * torch.randn(rows, 1000, generator=generator)).to(dtype)
    labels = torch.randint(0, 1000, (rows,), generator=generator)
    weights = torch.randn(2, rows, generator=generator)
    lean = _outputs_and_gradient(_lean, logits, labels, with_entropy, weights)
    naive = _outputs_and_gradient(_naive, logits, labels, with_entropy, weights)
    torch.testing.assert_close(lean[0], naive[0], **FP32_TOLERANCE)
    if with_entropy:
        torch.testing.assert_close(lean[1], naive[1], **FP32_TOLERANCE)
    assert lean[2].dtype == dtype
    grad_tolerance = (_fp32_gradient_tolerance(naive[2]) if dtype == torch.float32
                      else _bf16_gradient_tolerance(naive[2].float()))
    torch.testing.assert_close(lean[2], naive[2], **grad_tolerance)


def test_entropy_alone_has_the_gradient_of_the_entropy():
    logits = torch.randn(50, 300, dtype=torch.float64).float().requires_grad_(True)
    _, entropy = chunked_log_probs_and_entropy(logits, None, with_entropy=True)
    (gradient,) = torch.autograd.grad(entropy.sum(), logits)
    reference = logits.detach().clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(entropy_from_logits(reference).sum(), reference)
    torch.testing.assert_close(gradient, expected, **FP32_TOLERANCE)


def test_lean_head_passes_gradcheck_in_double_precision():
    logits = torch.randn(9, 13, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 13, (9,))

    def both(x):
        log_probs, entropy = chunked_log_probs_and_entropy(x, labels, with_entropy=True)
        return log_probs, entropy

    assert torch.autograd.gradcheck(both, (logits,))


def test_a_cuda_tensor_takes_flash_attns_cross_entropy_and_the_entropy_stays_chunked(monkeypatch):
    """The GPU branch, run on the CPU through flash-attn's memory twin (same signature and values)."""
    from rlplan.runtime.head_twins import flash_cross_entropy_loss

    calls = []

    def twin(logits, labels, inplace_backward=False):
        calls.append(inplace_backward)
        return flash_cross_entropy_loss(logits, labels, inplace_backward)

    monkeypatch.setattr(lean_head, "flash_attn_cross_entropy", lambda device: twin)
    logits = torch.randn(20, 64)
    labels = torch.randint(0, 64, (20,))
    weights = torch.randn(2, 20)
    flash = _outputs_and_gradient(
        lambda x, y, e: lean_log_probs_and_entropy(x, y, with_entropy=e), logits, labels, True, weights)
    naive = _outputs_and_gradient(_naive, logits, labels, True, weights)
    for got, expected in zip(flash, naive, strict=True):
        torch.testing.assert_close(got, expected, **FP32_TOLERANCE)
    # verl's rule: the gradient may overwrite the logits only when no entropy reads them afterwards.
    lean_log_probs_and_entropy(logits, labels, with_entropy=False)
    assert calls == [False, True]


def test_without_cuda_the_lean_head_is_the_chunked_one():
    assert lean_head.flash_attn_cross_entropy(torch.device("cpu")) is None


def test_lean_head_holds_a_fraction_of_the_naive_heads_bytes():
    from rlplan.runtime.head_twins import measure_head_bytes_per_token_vocab

    lean = measure_head_bytes_per_token_vocab("chunked", entropy=True)
    naive = measure_head_bytes_per_token_vocab("naive", entropy=True)
    # bf16 logits and their bf16 gradient (4 bytes) plus one of 16 chunks' fp32 work.
    assert 4.0 <= lean <= 5.5 < naive / 4
