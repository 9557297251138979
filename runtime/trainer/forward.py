"""One forward pass over a micro batch, reduced to the response tokens.

Two input layouts give the same numbers:
- padded: (b, T) right-padded with an attention mask;
- packed (remove padding): all sequences in one (1, sum L) stream, position ids
  restarting at 0 per sequence and no attention mask, which transformers turns
  into a block-diagonal causal mask (or, on CPU, runtime/trainer/varlen_attention.py
  splits into one attention per sequence). This is only correct with `use_cache=False`
  (with a cache object the packing is not detected and attention leaks across
  sequences, silently), so every call here passes it.

Only the rows that predict response tokens are kept, and the loss head
(runtime/algorithms/lean_head.py) upcasts them one chunk of rows at a time, in forward and
backward, so the (tokens, vocab) logits never exist whole in fp32; on a GPU with flash-attn
installed the log-probs come from its triton cross entropy, as in verl.

With Ulysses sequence parallelism (runtime/trainer/sequence_parallel.py) the packed
stream is split over the sp group: each rank runs the model on its slice, scores every
position of it, and the per-position results are gathered before the response rows are
picked, so every rank of the group returns the whole micro batch's numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import frozen

from rlplan.runtime.trainer.token_batch import TokenBatch

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from rlplan.runtime.trainer.sequence_parallel import PackedShard, SequenceParallelGroup


@frozen(kw_only=True)
class ForwardOptions:
    remove_padding: bool
    # The rollout's sampling temperature: vLLM reports log-probs of logits / T, so the trainer scores the same.
    temperature: float = 1.0
    # This rank's Ulysses group (a SequenceParallelGroup), None without sequence parallelism.
    sequence_parallel: SequenceParallelGroup | None = None


def model_inputs(micro: TokenBatch, device: torch.device | str, *, remove_padding: bool) -> tuple[dict[str, Tensor | None], Tensor]:
    """The model's keyword arguments and, per response token, the flat row index of its predicting logit."""
    import torch

    input_ids = micro["input_ids"]
    lengths = micro["sequence_lengths"].tolist()
    prompts = micro["prompt_lengths"].tolist()
    width = input_ids.shape[1]
    rows: list[Tensor] = []
    if remove_padding:
        from rlplan.runtime.batching import pack_sequences

        packed = pack_sequences([input_ids[i, :n].tolist() for i, n in enumerate(lengths)])
        starts = packed.cu_seqlens[:-1].tolist()
        for start, n, p in zip(starts, lengths, prompts, strict=True):
            rows.append(torch.arange(start + p - 1, start + n - 1))
        inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids, "attention_mask": None}
    else:
        attention = (torch.arange(width).unsqueeze(0) < micro["sequence_lengths"].unsqueeze(1)).long()
        positions = torch.arange(width).unsqueeze(0).expand(len(lengths), -1)
        for i, (n, p) in enumerate(zip(lengths, prompts, strict=True)):
            rows.append(torch.arange(i * width + p - 1, i * width + n - 1))
        inputs = {"input_ids": input_ids, "position_ids": positions, "attention_mask": attention}
    inputs = {k: (v.to(device) if v is not None else None) for k, v in inputs.items()}
    return inputs, torch.cat(rows).to(device)


def response_labels(micro: TokenBatch, device: torch.device | str) -> Tensor:
    import torch

    ids = micro["input_ids"]
    parts = [
        ids[i, p:n] for i, (p, n) in enumerate(zip(micro["prompt_lengths"].tolist(), micro["sequence_lengths"].tolist(), strict=True))
    ]
    return torch.cat(parts).to(device)


def scatter_to_responses(flat: Tensor, micro: TokenBatch) -> Tensor:
    """(N,) values over all response tokens -> (b, R) right-padded, on flat's device."""
    import torch

    lengths = micro.response_lengths.tolist()
    out = flat.new_zeros((len(lengths), max(lengths, default=0)))
    mask = torch.arange(out.shape[1], device=flat.device).unsqueeze(0) < torch.as_tensor(lengths, device=flat.device).unsqueeze(1)
    return out.masked_scatter(mask, flat)


def _head(logits: Tensor, labels: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """(log-probs, entropy or None) per row of (rows, vocab) logits, by the runtime's lean head."""
    from rlplan.runtime.algorithms.lean_head import lean_log_probs_and_entropy

    return lean_log_probs_and_entropy(logits, labels, with_entropy=with_entropy)


def policy_forward(model: nn.Module, micro: TokenBatch, device: torch.device | str, options: ForwardOptions, *, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """Log-probs of the response tokens, and their entropy when asked, both (b, R) in fp32."""
    if options.sequence_parallel is not None:
        return _policy_forward_sequence_parallel(model, micro, device, options, with_entropy=with_entropy)
    inputs, rows = model_inputs(micro, device, remove_padding=options.remove_padding)
    logits = model(**inputs, use_cache=False).logits
    # bf16 rows stay bf16 here: the log-prob and entropy functions upcast chunk by chunk.
    selected = logits.reshape(-1, logits.shape[-1]).index_select(0, rows)
    if options.temperature > 0 and options.temperature != 1.0:
        selected = selected / options.temperature
    log_probs, entropy = _head(selected, response_labels(micro, device), with_entropy)
    return scatter_to_responses(log_probs, micro), (scatter_to_responses(entropy, micro) if with_entropy else None)


def _ulysses_group(options: ForwardOptions) -> SequenceParallelGroup:
    if options.sequence_parallel is None:
        raise ValueError("the sequence-parallel forward needs this rank's Ulysses group")
    return options.sequence_parallel


def _sequence_parallel_forward(model: nn.Module, micro: TokenBatch, device: torch.device | str, options: ForwardOptions) -> tuple[Tensor, PackedShard, Tensor]:
    """(this rank's (S_pad/sp, out) model outputs, its shard, the response rows of the packed stream)."""
    from rlplan.runtime.trainer.sequence_parallel import UlyssesAttentionInputs, shard_packed

    if not options.remove_padding:
        raise ValueError("Ulysses sequence parallelism needs packed inputs (use_remove_padding)")
    group = _ulysses_group(options)
    inputs, rows = model_inputs(micro, device, remove_padding=True)
    shard = shard_packed(inputs["input_ids"], inputs["position_ids"], group)
    outputs = model(
        input_ids=shard.input_ids,
        position_ids=shard.position_ids,
        attention_mask=None,
        use_cache=False,
        ulysses=UlyssesAttentionInputs(group=group, cu_seqlens=shard.cu_seqlens),
    ).logits
    return outputs.reshape(-1, outputs.shape[-1]), shard, rows


def _policy_forward_sequence_parallel(
    model: nn.Module, micro: TokenBatch, device: torch.device | str, options: ForwardOptions, *, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    from rlplan.runtime.trainer.sequence_parallel import gather_tokens

    logits, shard, rows = _sequence_parallel_forward(model, micro, device, options)
    if options.temperature > 0 and options.temperature != 1.0:
        logits = logits / options.temperature
    group = _ulysses_group(options)
    local_log_probs, local_entropy = _head(logits, shard.labels, with_entropy)
    log_probs = gather_tokens(local_log_probs, group).index_select(0, rows)
    entropy = None
    if with_entropy:
        entropy = scatter_to_responses(gather_tokens(local_entropy, group).index_select(0, rows), micro)
    return scatter_to_responses(log_probs, micro), entropy


def value_forward(model: nn.Module, micro: TokenBatch, device: torch.device | str, options: ForwardOptions) -> Tensor:
    """The critic's value of the state before each response token, (b, R) in fp32."""
    if options.sequence_parallel is not None:
        from rlplan.runtime.trainer.sequence_parallel import gather_tokens

        values, _, rows = _sequence_parallel_forward(model, micro, device, options)
        gathered = gather_tokens(values.reshape(-1).float(), options.sequence_parallel)
        return scatter_to_responses(gathered.index_select(0, rows), micro)
    inputs, rows = model_inputs(micro, device, remove_padding=options.remove_padding)
    values = model(**inputs, use_cache=False).logits
    return scatter_to_responses(values.reshape(-1).index_select(0, rows).float(), micro)
