"""The batch the trainer workers see: sequences plus response-aligned per-token fields.

Each sample is one prompt followed by one response, stored right-padded in
`input_ids` (B, T) with its prompt and total lengths. Every per-token quantity
of the RL step (log-probs, advantages, values, the response mask) is stored
response-aligned as (B, R): column j is the j-th response token. This is the
layout verl's algorithms work on, and it makes a sample's fields independent of
how the batch is later packed or split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attrs import frozen

if TYPE_CHECKING:
    from torch import Tensor

SEQUENCE_FIELDS = ("input_ids", "prompt_lengths", "sequence_lengths")


@frozen
class TokenBatch:
    """Named tensors sharing the leading batch dimension."""

    tensors: dict[str, Tensor]

    def __attrs_post_init__(self) -> None:
        sizes = {name: t.shape[0] for name, t in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch fields disagree on the batch size: {sizes}")
        missing = [name for name in SEQUENCE_FIELDS if name not in self.tensors]
        if missing:
            raise ValueError(f"a token batch needs {missing}")

    def __len__(self) -> int:
        return int(self.tensors["input_ids"].shape[0])

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    @property
    def response_lengths(self) -> Tensor:
        return self.tensors["sequence_lengths"] - self.tensors["prompt_lengths"]

    @property
    def response_mask(self) -> Tensor:
        import torch

        lengths = self.response_lengths
        width = int(lengths.max().item()) if len(self) else 0
        return (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()

    @property
    def max_response_length(self) -> int:
        return int(self.response_lengths.max().item()) if len(self) else 0

    def with_fields(self, **fields: Tensor) -> TokenBatch:
        return TokenBatch({**self.tensors, **fields})

    def select(self, indices: Sequence[int]) -> TokenBatch:
        """The samples at `indices`, trimmed to their own longest sequence and response."""
        import torch

        index = torch.as_tensor(list(indices), dtype=torch.long)
        picked = {name: t.index_select(0, index) for name, t in self.tensors.items()}
        if not len(index):
            return TokenBatch(picked)
        longest_sequence = int(picked["sequence_lengths"].max().item())
        longest_response = int((picked["sequence_lengths"] - picked["prompt_lengths"]).max().item())
        for name, t in picked.items():
            if name == "input_ids":
                picked[name] = t[:, :longest_sequence]
            elif t.dim() == 2:
                picked[name] = t[:, :longest_response]
        return TokenBatch(picked)

    def to_cpu(self) -> TokenBatch:
        return TokenBatch({name: t.detach().cpu() for name, t in self.tensors.items()})


def token_batch_from_sequences(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_token_id: int = 0
) -> TokenBatch:
    """Right-padded sequences (prompt + response) with their lengths."""
    import torch

    if len(prompts) != len(responses):
        raise ValueError("one response per prompt")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    width = max(lengths, default=0)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        tokens = list(prompt) + list(response)
        input_ids[row, : len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
    return TokenBatch(
        {
            "input_ids": input_ids,
            "prompt_lengths": torch.as_tensor([len(p) for p in prompts], dtype=torch.long),
            "sequence_lengths": torch.as_tensor(lengths, dtype=torch.long),
        }
    )


def response_aligned(rows: Sequence[Sequence[float]], width: int | None = None, dtype: Any = None) -> Tensor:
    """(B, R) right-padded with zeros from per-sample response values."""
    import torch

    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.zeros((len(rows), width), dtype=dtype or torch.float32)
    for i, row in enumerate(rows):
        if len(row):
            out[i, : len(row)] = torch.as_tensor(list(row), dtype=out.dtype)
    return out


def concat_batches(batches: Sequence[TokenBatch], order: Sequence[int] | None = None) -> TokenBatch:
    """Concatenate shards (padding each field to the widest), optionally putting row k at position order[k]."""
    import torch

    names = list(batches[0].tensors)
    merged: dict[str, Tensor] = {}
    for name in names:
        parts = [b[name] for b in batches]
        if parts[0].dim() == 2:
            width = max(p.shape[1] for p in parts)
            parts = [torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts]
        merged[name] = torch.cat(parts, dim=0)
    if order is not None:
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.as_tensor(list(order), dtype=torch.long)] = torch.arange(len(order))
        merged = {name: t.index_select(0, inverse) for name, t in merged.items()}
    return TokenBatch(merged)
