"""The bundled runtime's lean loss head: log-probs and entropy without a whole fp32 (tokens, vocab).

`chunked_log_probs_and_entropy` is one autograd Function over (rows, vocab) logits of any float
dtype.  Forward walks the rows in `HEAD_ROW_CHUNKS` chunks, upcasting one chunk at a time, and
keeps only per-row fp32 values (lse, entropy); backward recomputes each chunk's softmax and writes
that chunk's gradient into one buffer in the logits' dtype.  So beside the logits the head holds
their gradient and one chunk's fp32 work, never the whole fp32 tensor; the planner prices it from
the measured allocations (planner.memory, head "chunked").

On a GPU with flash-attn installed, `lean_log_probs_and_entropy` hands the log-probs to flash-attn's
triton cross entropy instead (in-place backward when no entropy shares the logits), as verl does.

Gradients, with p = softmax(x), lse and H = lse - sum p x:
    d log p[label] / dx = onehot(label) - p
    d H / dx            = -p * (x - (lse - H))
"""

from __future__ import annotations

from typing import Any

import torch

# The rows are cut into this many chunks, so one chunk's fp32 work is a fixed share of the logits
# and the head's bytes per token x vocab do not depend on the batch.
HEAD_ROW_CHUNKS = 16


def _chunk_rows(rows: int) -> int:
    return max(1, -(-rows // HEAD_ROW_CHUNKS))


def _work_dtype(logits: torch.Tensor) -> torch.dtype:
    """fp32 for bf16 / fp16 / fp32 logits; fp64 stays fp64 (gradcheck)."""
    return torch.promote_types(logits.dtype, torch.float32)


def chunk_values(chunk: torch.Tensor, labels: torch.Tensor, *, with_entropy: bool) -> tuple[Any, Any, Any]:
    """(lse, label log-prob, entropy or None) of one fp32 chunk of logits rows."""
    lse = torch.logsumexp(chunk, dim=-1)
    log_probs = chunk.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return lse, log_probs, None
    probabilities = torch.exp(chunk - lse.unsqueeze(-1))
    return lse, log_probs, lse - (probabilities * chunk).sum(dim=-1)


def chunk_gradient(chunk: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor | None, labels: torch.Tensor,
                   grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> torch.Tensor:
    """The gradient of one fp32 chunk of logits rows, written over `chunk` (which it returns)."""
    lse = lse.unsqueeze(-1)
    probabilities = torch.exp(chunk - lse)
    if grad_entropy is not None and entropy is not None:
        # -p (x - E_p[x]) g_H, with E_p[x] = lse - H.
        chunk.sub_(lse - entropy.unsqueeze(-1)).mul_(probabilities).mul_(-grad_entropy.unsqueeze(-1))
    else:
        chunk.zero_()
    if grad_log_probs is not None:
        g = grad_log_probs.unsqueeze(-1)
        chunk.sub_(probabilities.mul_(g))
        chunk.scatter_add_(-1, labels.unsqueeze(-1), g)
    return chunk


class _ChunkedLogProbEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool,
                with_log_probs: bool) -> tuple[torch.Tensor, torch.Tensor]:
        rows = logits.shape[0]
        step = _chunk_rows(rows)
        work = _work_dtype(logits)
        lse = torch.empty(rows, dtype=work, device=logits.device)
        log_probs = torch.empty(rows, dtype=work, device=logits.device)
        entropy = torch.empty(rows if with_entropy else 0, dtype=work, device=logits.device)
        for start in range(0, rows, step):
            end = start + step
            chunk = logits[start:end].to(work)
            lse[start:end], log_probs[start:end], chunk_entropy = chunk_values(
                chunk, labels[start:end], with_entropy=with_entropy)
            if with_entropy:
                entropy[start:end] = chunk_entropy
            del chunk, chunk_entropy
        ctx.save_for_backward(logits, labels, lse, entropy)
        ctx.with_log_probs = with_log_probs
        if not with_log_probs:
            ctx.mark_non_differentiable(log_probs)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, grad_log_probs: torch.Tensor, grad_entropy: torch.Tensor) -> Any:
        logits, labels, lse, entropy = ctx.saved_tensors
        with_entropy = entropy.numel() > 0 and grad_entropy is not None
        with_log_probs = ctx.with_log_probs and grad_log_probs is not None
        grad_logits = torch.empty_like(logits)
        rows = logits.shape[0]
        step = _chunk_rows(rows)
        for start in range(0, rows, step):
            end = start + step
            # A copy even for fp32 logits: it becomes this chunk's gradient in place.
            chunk = logits[start:end].to(lse.dtype, copy=True)
            grad_logits[start:end] = chunk_gradient(
                chunk, lse[start:end], entropy[start:end] if with_entropy else None, labels[start:end],
                grad_log_probs[start:end] if with_log_probs else None,
                grad_entropy[start:end] if with_entropy else None)
            del chunk
        return grad_logits, None, None, None


def chunked_log_probs_and_entropy(logits: torch.Tensor, labels: torch.Tensor | None, *,
                                  with_entropy: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(log softmax(logits)[label] or None without labels, entropy or None), fp32 (fp64 for fp64) per row.

    `logits` is (rows, vocab) in any float dtype; the gradient comes back in that dtype.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be (rows, vocab), got shape {tuple(logits.shape)}")
    with_log_probs = labels is not None
    if labels is None:
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    elif labels.shape != logits.shape[:1]:
        raise ValueError(f"labels {tuple(labels.shape)} must be one per row of logits {tuple(logits.shape)}")
    log_probs, entropy = _ChunkedLogProbEntropy.apply(logits, labels, with_entropy, with_log_probs)
    return (log_probs if with_log_probs else None), (entropy if with_entropy else None)


def flash_attn_cross_entropy(device: torch.device) -> Any:
    """flash-attn's triton cross_entropy_loss for tensors on `device`, or None (not CUDA, not installed)."""
    if device.type != "cuda":
        return None
    try:
        from flash_attn.ops.triton.cross_entropy import cross_entropy_loss
    except ImportError:
        return None
    return cross_entropy_loss


def lean_log_probs_and_entropy(logits: torch.Tensor, labels: torch.Tensor, *,
                               with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The runtime's head: flash-attn's cross entropy on CUDA logits when installed, else the chunked one."""
    cross_entropy = flash_attn_cross_entropy(logits.device)
    if cross_entropy is None:
        log_probs, entropy = chunked_log_probs_and_entropy(logits, labels, with_entropy=with_entropy)
        assert log_probs is not None
        return log_probs, entropy
    # verl's choice: the gradient overwrites the logits only when no entropy needs them afterwards.
    losses, _ = cross_entropy(logits, labels, inplace_backward=not with_entropy)
    entropy = chunked_log_probs_and_entropy(logits, None, with_entropy=True)[1] if with_entropy else None
    return -losses, entropy
