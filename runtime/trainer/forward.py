"""One forward pass over a micro batch, reduced to the response tokens.

Two input layouts give the same numbers:
- padded: (b, T) right-padded with an attention mask;
- packed (remove padding): all sequences in one (1, sum L) stream, position ids
  restarting at 0 per sequence and no attention mask, which transformers turns
  into a block-diagonal causal mask (or, on CPU, runtime/trainer/varlen_attention.py
  splits into one attention per sequence). This is only correct with `use_cache=False`
  (with a cache object the packing is not detected and attention leaks across
  sequences, silently), so every call here passes it.

Only the rows that predict response tokens are kept before the fp32 cast, so the
full (tokens, vocab) logits never exist in fp32.

With Ulysses sequence parallelism (runtime/trainer/sequence_parallel.py) the packed
stream is split over the sp group: each rank runs the model on its slice, scores every
position of it, and the per-position results are gathered before the response rows are
picked, so every rank of the group returns the whole micro batch's numbers.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from rlplan.runtime.trainer.token_batch import TokenBatch


@frozen(kw_only=True)
class ForwardOptions:
    remove_padding: bool
    # Vocabulary rows per chunk for the entropy; 0 computes it in one piece.
    entropy_chunk_size: int = 0
    # Recompute the entropy in backward instead of keeping its (tokens, vocab) intermediates.
    entropy_checkpointing: bool = False
    # The rollout's sampling temperature: vLLM reports log-probs of logits / T, so the trainer scores the same.
    temperature: float = 1.0
    # This rank's Ulysses group (a SequenceParallelGroup), None without sequence parallelism.
    sequence_parallel: Any = None


def model_inputs(micro: TokenBatch, device: Any, *, remove_padding: bool) -> tuple[dict[str, Any], Any]:
    """The model's keyword arguments and, per response token, the flat row index of its predicting logit."""
    import torch

    input_ids = micro["input_ids"]
    lengths = micro["sequence_lengths"].tolist()
    prompts = micro["prompt_lengths"].tolist()
    width = input_ids.shape[1]
    rows: list[Any] = []
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


def response_labels(micro: TokenBatch, device: Any) -> Any:
    import torch

    ids = micro["input_ids"]
    parts = [
        ids[i, p:n] for i, (p, n) in enumerate(zip(micro["prompt_lengths"].tolist(), micro["sequence_lengths"].tolist(), strict=True))
    ]
    return torch.cat(parts).to(device)


def scatter_to_responses(flat: Any, micro: TokenBatch) -> Any:
    """(N,) values over all response tokens -> (b, R) right-padded, on flat's device."""
    import torch

    lengths = micro.response_lengths.tolist()
    out = flat.new_zeros((len(lengths), max(lengths, default=0)))
    mask = torch.arange(out.shape[1], device=flat.device).unsqueeze(0) < torch.as_tensor(lengths, device=flat.device).unsqueeze(1)
    return out.masked_scatter(mask, flat)


def _entropy(logits: Any, options: ForwardOptions) -> Any:
    from torch.utils.checkpoint import checkpoint

    from rlplan.runtime.algorithms import entropy_from_logits

    chunk = options.entropy_chunk_size or None
    if options.entropy_checkpointing and logits.requires_grad:
        return checkpoint(entropy_from_logits, logits, chunk, use_reentrant=False)
    return entropy_from_logits(logits, chunk)


def policy_forward(model: Any, micro: TokenBatch, device: Any, options: ForwardOptions, *, with_entropy: bool) -> tuple[Any, Any]:
    """Log-probs of the response tokens, and their entropy when asked, both (b, R) in fp32."""
    from rlplan.runtime.algorithms import log_probs_from_logits

    if options.sequence_parallel is not None:
        return _policy_forward_sequence_parallel(model, micro, device, options, with_entropy=with_entropy)
    inputs, rows = model_inputs(micro, device, remove_padding=options.remove_padding)
    logits = model(**inputs, use_cache=False).logits
    # bf16 rows stay bf16 here: the log-prob and entropy functions upcast chunk by chunk.
    selected = logits.reshape(-1, logits.shape[-1]).index_select(0, rows)
    if options.temperature > 0 and options.temperature != 1.0:
        selected = selected / options.temperature
    chunk = options.entropy_chunk_size or None
    log_probs = scatter_to_responses(log_probs_from_logits(selected, response_labels(micro, device), chunk), micro)
    entropy = scatter_to_responses(_entropy(selected, options), micro) if with_entropy else None
    return log_probs, entropy


def _sequence_parallel_forward(model: Any, micro: TokenBatch, device: Any, options: ForwardOptions) -> tuple[Any, Any, Any]:
    """(this rank's (S_pad/sp, out) model outputs, its shard, the response rows of the packed stream)."""
    from rlplan.runtime.trainer.sequence_parallel import UlyssesAttentionInputs, shard_packed

    if not options.remove_padding:
        raise ValueError("Ulysses sequence parallelism needs packed inputs (use_remove_padding)")
    inputs, rows = model_inputs(micro, device, remove_padding=True)
    group = options.sequence_parallel
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
    model: Any, micro: TokenBatch, device: Any, options: ForwardOptions, *, with_entropy: bool
) -> tuple[Any, Any]:
    from rlplan.runtime.algorithms import log_probs_from_logits
    from rlplan.runtime.trainer.sequence_parallel import gather_tokens

    logits, shard, rows = _sequence_parallel_forward(model, micro, device, options)
    if options.temperature > 0 and options.temperature != 1.0:
        logits = logits / options.temperature
    chunk = options.entropy_chunk_size or None
    group = options.sequence_parallel
    log_probs = gather_tokens(log_probs_from_logits(logits, shard.labels, chunk), group).index_select(0, rows)
    entropy = None
    if with_entropy:
        entropy = scatter_to_responses(gather_tokens(_entropy(logits, options), group).index_select(0, rows), micro)
    return scatter_to_responses(log_probs, micro), entropy


def value_forward(model: Any, micro: TokenBatch, device: Any, options: ForwardOptions) -> Any:
    """The critic's value of the state before each response token, (b, R) in fp32."""
    if options.sequence_parallel is not None:
        from rlplan.runtime.trainer.sequence_parallel import gather_tokens

        values, _, rows = _sequence_parallel_forward(model, micro, device, options)
        gathered = gather_tokens(values.reshape(-1).float(), options.sequence_parallel)
        return scatter_to_responses(gathered.index_select(0, rows), micro)
    inputs, rows = model_inputs(micro, device, remove_padding=options.remove_padding)
    values = model(**inputs, use_cache=False).logits
    return scatter_to_responses(values.reshape(-1).index_select(0, rows).float(), micro)
