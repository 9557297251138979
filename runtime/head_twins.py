"""Memory twins of the loss heads verl runs on GPUs, so a CPU tracker measures them.

A kernel's memory is what it allocates and what it saves for backward (memory-model.md 2.4b).
Each head here allocates and saves exactly that, on any device, and computes the same numbers
(log-probs and entropy of bf16 logits), so `rlplan measure --head ...` counts the step as verl
runs it on GPUs:

- ``flash_attn_ce``: flash-attn's triton ``CrossEntropyLoss`` (flash_attn/ops/triton/cross_entropy.py).
  Forward allocates three fp32 vectors of one value per row (losses, lse, z_losses) and saves
  (logits, lse, labels); backward writes dlogits into the saved logits (``inplace_backward``) or into
  ``empty_like(logits)``.  The triton kernels keep their work in registers; the twin computes the
  values in blocks of rows whose transients are a small fraction of the logits (``_row_blocks``).
- ``torch_logprob``: verl's ``logprobs_from_logits_v2`` on bf16 logits, which is plain torch and
  allocates the same on a CPU: one log_softmax per row, gathered.
- ``fused``: ``model.use_fused_kernels`` (verl/utils/kernel/linear_cross_entropy.py, kernels.py)
  computes the log-probs and entropy from the hidden states inside the lm_head and never holds the
  logits: the twin saves the hidden states and the weight and recomputes each block in backward,
  holding verl's bf16 gradients and its one (tokens, 9504) bf16 vocab-split buffer.
- entropy ``eager`` / ``checkpointed`` / ``chunked``: verl's ``entropy_from_logits`` (under
  ``torch.utils.checkpoint``) and ``entropy_from_logits_with_chunking``, plain torch as well.
- entropy ``compiled`` (torch.compile, verl's default): dynamo runs eagerly while a TorchDispatchMode
  (the tracker, fake tensors) is active, so torch.compile itself cannot be measured here; the twin is
  what inductor generates for ``entropy_from_logits``: one fused row reduction in forward (softmax,
  logsumexp and the weighted sum never materialize), saving its input (the logits) and one fp32 value
  per row, and one fused backward kernel writing the bf16 gradient ``-p * (z - E_p[z]) * grad``.

Before verl's logits heads (``flash_attn_ce``, ``torch_logprob``) the twins run verl's own lines between
the model and the head (``verl_scaled_logits``: dp_actor._forward_micro_batch, the engine worker's
prepare_model_outputs): the model's (1, tokens, vocab) output squeezed to a view and divided by the
temperature in place, which makes autograd rebase the view (CopySlices) and run the division's backward
after the head's (planner.memory, "The temperature").  The fused kernels take the temperature inside.

``naive`` (rlplan's fp32 head, runtime.measure) and ``chunked`` (rlplan's lean runtime head,
runtime.algorithms.lean_head) are the runtime's own code, measured as they are: it divides nothing in place.

torch is imported inside functions only: rlplan.planner imports this module's names never.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor
    from torch.autograd.function import FunctionCtx

# verl's entropy chunk, its fused kernels' vocab split and its logits heads, as the planner prices them.
from rlplan.planner.memory.heads import ENTROPY_CHUNK_ROWS, FUSED_DLOGITS_SPLIT_VOCAB, VERL_LOGITS_HEADS

# Any temperature other than 1 (verl divides whatever its value; only the values depend on it).
TWIN_TEMPERATURE = 0.7

# The entropy variants a tracker can measure ("compiled" through its twin, see the module docstring).
MEASURABLE_ENTROPY_VARIANTS = ("eager", "checkpointed", "chunked", "compiled")


def verl_scaled_logits(output_logits: Tensor, temperature: float = TWIN_TEMPERATURE) -> Tensor:
    """The (tokens, vocab) logits verl's head reads, made from the model's output as verl makes them.

    Packed (remove padding, one row): ``logits_rmpad = output.logits.squeeze(0)`` then
    ``logits_rmpad.div_(temperature)``, in place on the view.  Padded rows: ``logits.div_(temperature)``
    on the output itself, then the rows flattened (verl slices the responses out there; not modelled).
    """
    if output_logits.shape[0] == 1:
        logits = output_logits.squeeze(0)
        logits.div_(temperature)
        return logits
    output_logits.div_(temperature)
    return output_logits.flatten(0, 1)


def _row_blocks(rows: int) -> int:
    """Rows per block for a twin's values: at most 1/256 of the logits at a time, so the fp32
    transients the triton kernel never allocates stay within ~2 % of the bf16 logits."""
    return max(1, rows // 256)


def _block_log_softmax_stats(block: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """(lse, label logit) of one block of rows, in fp32."""
    import torch

    block = block.float()
    return torch.logsumexp(block, dim=-1), block.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def flash_cross_entropy_function() -> type[torch.autograd.Function]:
    import torch

    class FlashCrossEntropyTwin(torch.autograd.Function):
        """losses = lse - logit[label], saving what flash-attn's CrossEntropyLoss saves."""

        @staticmethod
        def forward(ctx: FunctionCtx, logits: Tensor, labels: Tensor, inplace_backward: bool) -> tuple[Tensor, Tensor]:
            rows = logits.shape[0]
            losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
            lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
            z_losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
            step = _row_blocks(rows)
            with torch.no_grad():
                for start in range(0, rows, step):
                    end = start + step
                    block_lse, label_logit = _block_log_softmax_stats(logits[start:end], labels[start:end])
                    lse[start:end] = block_lse
                    losses[start:end] = block_lse - label_logit
                z_losses.zero_()
            ctx.save_for_backward(logits, lse, labels)
            ctx.inplace_backward = inplace_backward
            ctx.mark_non_differentiable(z_losses)
            return losses, z_losses

        @staticmethod
        def backward(ctx: FunctionCtx, grad_losses: Tensor, grad_z_losses: Tensor) -> tuple[Tensor | None, ...]:
            del grad_z_losses
            logits, lse, labels = ctx.saved_tensors
            dlogits = logits if ctx.inplace_backward else torch.empty_like(logits)
            rows = logits.shape[0]
            step = _row_blocks(rows)
            for start in range(0, rows, step):
                end = start + step
                # d loss / d logits = softmax - onehot(label), scaled by the loss's gradient.
                block = torch.exp(logits[start:end].float() - lse[start:end].unsqueeze(-1))
                block.scatter_add_(-1, labels[start:end].unsqueeze(-1),
                                   -torch.ones_like(lse[start:end]).unsqueeze(-1))
                dlogits[start:end] = block * grad_losses[start:end].unsqueeze(-1)
            return dlogits, None, None

    return FlashCrossEntropyTwin


def flash_cross_entropy_loss(logits: Tensor, labels: Tensor, inplace_backward: bool = False) -> tuple[Tensor, Tensor]:
    """The twin of flash_attn.ops.triton.cross_entropy.cross_entropy_loss: (losses, z_losses)."""
    return flash_cross_entropy_function().apply(logits, labels, inplace_backward)


def flash_attn_log_probs(logits: Tensor, labels: Tensor, *, inplace_backward: bool) -> Tensor:
    """verl's logprobs_from_logits_flash_attn: -losses of flash-attn's cross entropy."""
    losses, _ = flash_cross_entropy_loss(logits, labels, inplace_backward)
    return -losses


def row_wise_log_probs(logits: Tensor, labels: Tensor) -> Tensor:
    """verl's logprobs_from_logits_v2 on bf16 logits: one log_softmax per row, gathered."""
    import torch

    if logits.dtype in (torch.float32, torch.float64):
        label_logits = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
        return label_logits - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    picked = []
    for row_logits, row_label in zip(logits, labels, strict=True):
        row = torch.nn.functional.log_softmax(row_logits, dim=-1)
        picked.append(row.gather(dim=-1, index=row_label.unsqueeze(-1)).squeeze(-1))
    return torch.stack(picked)


def verl_entropy(logits: Tensor) -> Tensor:
    """verl's entropy_from_logits: softmax in the logits' dtype."""
    import torch

    probabilities = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probabilities * logits, dim=-1)


def verl_chunked_entropy(logits: Tensor, chunk_rows: int = ENTROPY_CHUNK_ROWS) -> Tensor:
    """verl's entropy_from_logits_with_chunking: fp32 chunks written into one result vector."""
    import torch

    entropy = torch.zeros(logits.shape[0], device=logits.device)
    for start in range(0, logits.shape[0], chunk_rows):
        chunk = logits[start : start + chunk_rows].float()
        probabilities = torch.nn.functional.softmax(chunk, dim=-1)
        entropy[start : start + chunk_rows] = torch.logsumexp(chunk, dim=-1) - torch.sum(probabilities * chunk, dim=-1)
    return entropy


def compiled_entropy_function() -> type[torch.autograd.Function]:
    import torch

    class CompiledEntropyTwin(torch.autograd.Function):
        """verl's entropy_from_logits as inductor fuses it: row reductions, the logits saved, one bf16 gradient."""

        @staticmethod
        def forward(ctx: FunctionCtx, logits: Tensor) -> Tensor:
            rows = logits.shape[0]
            # Reductions in fp32 (fp64 stays fp64), as inductor accumulates a bf16 reduction.
            work = torch.promote_types(logits.dtype, torch.float32)
            entropy = torch.empty(rows, dtype=work, device=logits.device)
            mean_logit = torch.empty(rows, dtype=work, device=logits.device)
            step = _row_blocks(rows)
            with torch.no_grad():
                for start in range(0, rows, step):
                    block = logits[start:start + step].to(work)
                    probabilities = torch.softmax(block, dim=-1)
                    mean_logit[start:start + step] = (probabilities * block).sum(-1)
                    entropy[start:start + step] = torch.logsumexp(block, dim=-1) - mean_logit[start:start + step]
            ctx.save_for_backward(logits, mean_logit)
            return entropy.to(logits.dtype)

        @staticmethod
        def backward(ctx: FunctionCtx, grad_entropy: Tensor) -> tuple[Tensor | None, ...]:
            logits, mean_logit = ctx.saved_tensors
            work = mean_logit.dtype
            dlogits = torch.empty_like(logits)
            rows = logits.shape[0]
            step = _row_blocks(rows)
            for start in range(0, rows, step):
                block = logits[start:start + step].to(work)
                probabilities = torch.softmax(block, dim=-1)
                # dH/dz = -p (z - E_p[z]), per row times the entropy's gradient.
                centred = block - mean_logit[start:start + step].unsqueeze(-1)
                grad = -probabilities * centred * grad_entropy[start:start + step].to(work).unsqueeze(-1)
                dlogits[start:start + step] = grad
            return dlogits

    return CompiledEntropyTwin


def compiled_entropy(logits: Tensor) -> Tensor:
    """The twin of torch.compile(entropy_from_logits) (verl's default, actor.use_torch_compile)."""
    return compiled_entropy_function().apply(logits)


def verl_entropy_variant(logits: Tensor, variant: str) -> Tensor:
    """The entropy verl computes for the plan's variant (eager, checkpointed, chunked or compiled)."""
    if variant == "chunked":
        return verl_chunked_entropy(logits)
    if variant == "compiled":
        return compiled_entropy(logits)
    if variant == "checkpointed" and logits.requires_grad:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(verl_entropy, logits, use_reentrant=False)
    if variant in MEASURABLE_ENTROPY_VARIANTS:
        return verl_entropy(logits)
    raise ValueError(f"entropy variant {variant!r} has no memory twin; use one of {MEASURABLE_ENTROPY_VARIANTS}")


def fused_linear_function() -> type[torch.autograd.Function]:
    import torch

    from rlplan.runtime.algorithms.lean_head import chunk_gradient, chunk_values

    class FusedLinearLogProbTwin(torch.autograd.Function):
        """log-probs and entropy of hidden @ weight.T block by block, saving hidden, weight and per-row
        values only (verl's use_fused_kernels): no (tokens, vocab) tensor outlives one block."""

        @staticmethod
        def forward(ctx: FunctionCtx, hidden: Tensor, weight: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
            rows = hidden.shape[0]
            lse, log_probs, entropy = (torch.empty(rows, dtype=torch.float32, device=hidden.device)
                                       for _ in range(3))
            step = _row_blocks(rows)
            with torch.no_grad():
                for start in range(0, rows, step):
                    end = start + step
                    lse[start:end], log_probs[start:end], entropy[start:end] = chunk_values(
                        (hidden[start:end] @ weight.T).float(), labels[start:end], with_entropy=True)
            ctx.save_for_backward(hidden, weight, labels, lse, entropy)
            return log_probs, entropy

        @staticmethod
        def backward(ctx: FunctionCtx, grad_log_probs: Tensor, grad_entropy: Tensor) -> tuple[Tensor | None, ...]:
            hidden, weight, labels, lse, entropy = ctx.saved_tensors
            # verl's default backward (_Split_Dlogits_N): bf16 d_hidden and d_weight, and one bf16
            # (tokens, 9504) buffer the logits' gradient is built in, vocab split by vocab split.
            grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
            grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
            rows = hidden.shape[0]
            split_buffer = torch.empty((rows, min(weight.shape[0], FUSED_DLOGITS_SPLIT_VOCAB)), dtype=hidden.dtype,
                                       device=hidden.device)
            step = _row_blocks(rows)
            for start in range(0, rows, step):
                end = start + step
                block = chunk_gradient(
                    (hidden[start:end] @ weight.T).float(), lse[start:end], entropy[start:end], labels[start:end],
                    None if grad_log_probs is None else grad_log_probs[start:end],
                    None if grad_entropy is None else grad_entropy[start:end]).to(hidden.dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = block @ weight
                if grad_weight is not None:
                    grad_weight += block.T @ hidden[start:end]
            del split_buffer
            return grad_hidden, grad_weight, None

    return FusedLinearLogProbTwin


def fused_log_probs_and_entropy(hidden: Tensor, weight: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    return fused_linear_function().apply(hidden, weight, labels)


def naive_log_probs_and_entropy(logits: Tensor, labels: Tensor, *, entropy: bool, chunked: bool) -> tuple[Tensor, Tensor | None]:
    """rlplan's former runtime head: fp32 logits, cross entropy, entropy whole or in 2048-row chunks."""
    import torch

    logits = logits.float()
    log_probs = -torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    if not entropy:
        return log_probs, None
    if not chunked:
        return log_probs, _fp32_entropy(logits)
    chunks = [_fp32_entropy(logits[i : i + ENTROPY_CHUNK_ROWS]) for i in range(0, logits.shape[0], ENTROPY_CHUNK_ROWS)]
    return log_probs, torch.cat(chunks)


def _fp32_entropy(logits: Tensor) -> Tensor:
    import torch

    probabilities = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probabilities * logits, dim=-1)


# --- the head's bytes per token x vocab, measured ------------------------------------------------


def measure_head_bytes_per_token_vocab(head: str, *, entropy: bool, entropy_variant: str = "eager",
                                       grad: bool = True, vocab: int = 8192, hidden: int = 16,
                                       tokens: tuple[int, int] = (2048, 4096)) -> float:
    """The head's peak bytes per token x vocab, as the slope of a tracker's peak between two token counts.

    An lm_head matmul (hidden x vocab, bf16) on one packed row feeds the head, as in the model, and
    verl's logits heads read its output through verl's in-place temperature (verl_scaled_logits), so
    the logits and their gradients live and die as they do in a step; the slope drops everything that does not
    grow with tokens (the weight, its gradient), and `hidden` << `vocab` makes the (tokens, hidden)
    terms negligible.  Run on fake tensors: nothing is allocated.
    """
    low, high = (head_peak_bytes(head, entropy=entropy, entropy_variant=entropy_variant, grad=grad,
                                 vocab=vocab, hidden=hidden, tokens=count) for count in tokens)
    return (high - low) / ((tokens[1] - tokens[0]) * vocab)


def head_peak_bytes(head: str, *, entropy: bool, entropy_variant: str, grad: bool, vocab: int, hidden: int,
                    tokens: int) -> int:
    """The tracker's peak over an lm_head matmul and the named head at one token count (fake tensors)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with FakeTensorMode():
        states = torch.randn(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=grad)
        weight = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=grad)
        labels = torch.randint(0, vocab, (tokens,))
        with tracker, torch.set_grad_enabled(grad):
            log_probs, entropy_values = head_outputs(head, states, weight, labels, entropy=entropy,
                                                     entropy_variant=entropy_variant)
            loss = -log_probs.sum()
            if entropy_values is not None:
                loss = loss - 0.001 * entropy_values.sum()
            if grad:
                loss.backward()
            del log_probs, entropy_values, loss
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def head_outputs(head: str, states: Tensor, weight: Tensor, labels: Tensor, *, entropy: bool,
                 entropy_variant: str) -> tuple[Tensor, Tensor | None]:
    """(log-probs, entropy or None) of (1, tokens, hidden) states through an lm_head weight, by the named
    head, reading the model's output as verl does (model_output_logits)."""
    if head == "fused":
        log_probs, entropy_values = fused_log_probs_and_entropy(states.flatten(0, 1), weight, labels)
        return log_probs, entropy_values if entropy else None
    return logits_head(head, model_output_logits(head, states @ weight.T), labels, entropy=entropy,
                       entropy_variant=entropy_variant)


def model_output_logits(head: str, output_logits: Tensor) -> Tensor:
    """The model's (rows, length, vocab) output as the named head reads it: through verl's in-place
    temperature for verl's logits heads, as it is (rows flattened) for rlplan's own."""
    if head in VERL_LOGITS_HEADS:
        return verl_scaled_logits(output_logits)
    return output_logits.flatten(0, 1)


def logits_head(head: str, logits: Tensor, labels: Tensor, *, entropy: bool, entropy_variant: str) -> tuple[Tensor, Tensor | None]:
    """(log-probs, entropy or None) of (rows, vocab) logits, computed by the named head as it runs."""
    if head == "flash_attn_ce":
        # verl: inplace_backward = not calculate_entropy (the entropy still needs the logits).
        log_probs = flash_attn_log_probs(logits, labels, inplace_backward=not entropy)
    elif head == "torch_logprob":
        log_probs = row_wise_log_probs(logits, labels)
    elif head == "naive":
        return naive_log_probs_and_entropy(logits, labels, entropy=entropy, chunked=entropy_variant == "chunked")
    elif head == "chunked":
        from rlplan.runtime.algorithms.lean_head import chunked_log_probs_and_entropy

        return chunked_log_probs_and_entropy(logits, labels, with_entropy=entropy)
    else:
        raise ValueError(f"no logits head named {head!r}")
    return log_probs, verl_entropy_variant(logits, entropy_variant) if entropy else None
