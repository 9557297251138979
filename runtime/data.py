"""Prompt datasets in verl's format, and the deterministic, resumable prompt sampler.

verl's format: one row per prompt with data_source, prompt (a list of chat messages
{role, content}), ability, reward_model {"style", "ground_truth"} and extra_info. Files
are parquet (as verl's preprocessing scripts write them) or JSONL with the same fields.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from attrs import define, field, frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import DataSection

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REQUIRED_COLUMNS = ("data_source", "reward_model")


@frozen
class PromptRecord:
    """One tokenized prompt and what its reward needs."""

    index: int
    data_source: str
    prompt_ids: tuple[int, ...]
    ground_truth: Any
    extra_info: dict[str, Any] = field(factory=dict)


@frozen
class PromptDataset:
    """The prompts a run trains on, with how many the length limit removed or cut."""

    records: tuple[PromptRecord, ...]
    num_filtered: int
    num_truncated: int

    def __len__(self) -> int:
        return len(self.records)


def read_rows(path: str | Path, prompt_key: str = "prompt") -> list[dict[str, Any]]:
    """Rows of a verl-format parquet or JSONL file, checked for the columns rlplan reads."""
    path = Path(path)
    if not path.exists():
        raise PlanError(
            field="data.train_files",
            message=f"{path} does not exist.",
            fix="point data.train_files at verl-format parquet or JSONL files",
        )
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif path.suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    else:
        raise PlanError(
            field="data.train_files",
            message=f"{path} is neither .parquet nor .jsonl.",
            fix="convert the dataset to verl's parquet format or to JSONL with the same columns",
        )
    for number, row in enumerate(rows):
        missing = [column for column in (prompt_key, *REQUIRED_COLUMNS) if column not in row]
        if missing:
            raise PlanError(
                field="data.prompt_key" if prompt_key in missing else "data.train_files",
                message=f"row {number} of {path} lacks {', '.join(missing)}.",
                fix="write rows with data_source, prompt (chat messages), reward_model.ground_truth",
            )
    return rows


def truncate_prompt(ids: Sequence[int], max_length: int, side: str) -> tuple[int, ...]:
    """Cut a prompt to max_length tokens, keeping its end ("left"), start ("right") or both ends ("middle")."""
    if len(ids) <= max_length:
        return tuple(ids)
    if side == "left":
        return tuple(ids[len(ids) - max_length :])
    if side == "right":
        return tuple(ids[:max_length])
    if side == "middle":
        head = max_length // 2
        return tuple(ids[:head]) + tuple(ids[len(ids) - (max_length - head) :])
    raise ValueError(f"unknown truncation side {side!r}")


def tokenize_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of the chat-templated prompt, ending where the assistant's answer starts."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    # The template writes every special token itself; the tokenizer must not add more.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_prompt_dataset(rows: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, data: DataSection) -> PromptDataset:
    """Tokenize rows and apply data.max_prompt_length as verl does.

    filter_overlong_prompts (or truncation "filter") drops overlong prompts first; what is
    still too long is cut per data.truncation, and truncation "error" refuses the dataset.
    """
    limit = data.max_prompt_length
    filtering = data.filter_overlong_prompts or data.truncation == "filter"
    records: list[PromptRecord] = []
    overlong: list[int] = []
    num_filtered = 0
    for number, row in enumerate(rows):
        ids = tokenize_prompt(tokenizer, row[data.prompt_key])
        if len(ids) > limit:
            if filtering:
                num_filtered += 1
                continue
            overlong.append(len(ids))
            if data.truncation != "error":
                ids = list(truncate_prompt(ids, limit, data.truncation))
        reward_model = row["reward_model"] or {}
        records.append(
            PromptRecord(
                index=number,
                data_source=str(row["data_source"]),
                prompt_ids=tuple(ids),
                ground_truth=reward_model.get("ground_truth"),
                extra_info=dict(row.get("extra_info") or {}),
            )
        )
    if overlong and data.truncation == "error":
        raise PlanError(
            field="data.max_prompt_length",
            message=(
                f"{len(overlong)} of {len(rows)} prompts are longer than {limit} tokens "
                f"(longest {max(overlong)}) and data.truncation is 'error'."
            ),
            fix=(
                f"raise data.max_prompt_length to {max(overlong)}, set data.filter_overlong_prompts = true, "
                "or set data.truncation to left, right or middle"
            ),
        )
    if not records:
        raise PlanError(
            field="data.max_prompt_length",
            message=f"all {len(rows)} prompts are longer than {limit} tokens, so none is left to train on.",
            fix="raise data.max_prompt_length or shorten the prompts",
        )
    return PromptDataset(records=tuple(records), num_filtered=num_filtered, num_truncated=len(overlong))


def load_prompt_dataset(files: Sequence[str | Path], tokenizer: PreTrainedTokenizerBase, data: DataSection) -> PromptDataset:
    """Read every file (in order) and build one dataset from their rows."""
    rows: list[dict[str, Any]] = []
    for path in files:
        rows.extend(read_rows(path, data.prompt_key))
    if not rows:
        raise PlanError(
            field="data.train_files",
            message="no prompts were found.",
            fix="list at least one non-empty parquet or JSONL file in data.train_files",
        )
    return build_prompt_dataset(rows, tokenizer, data)


def epoch_order(num_prompts: int, epoch: int, *, shuffle: bool, seed: int) -> list[int]:
    """The order prompts are visited in one epoch: a permutation seeded by (seed, epoch)."""
    order = list(range(num_prompts))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def _positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


@define
class PromptSampler:
    """Batches of prompt indices, epoch after epoch, resumable from (epoch, position).

    Every batch is full (the incomplete tail of an epoch is dropped, as verl does), so the
    state after the last batch of an epoch already points at the next epoch: resuming there
    continues training instead of finishing an exhausted epoch with zero steps.
    """

    num_prompts: int = field(validator=_positive)
    batch_size: int = field(validator=_positive)
    shuffle: bool = True
    seed: int = 1
    epoch: int = 0
    position: int = 0

    def __attrs_post_init__(self) -> None:
        if self.batch_size > self.num_prompts:
            raise PlanError(
                field="data.train_batch_size",
                message=f"is {self.batch_size}, but the dataset holds only {self.num_prompts} prompts.",
                fix=f"set data.train_batch_size <= {self.num_prompts} or add prompts",
            )

    @classmethod
    def for_plan(cls, num_prompts: int, data: DataSection) -> PromptSampler:
        return cls(
            num_prompts=num_prompts, batch_size=data.train_batch_size, shuffle=data.shuffle, seed=data.seed
        )

    @property
    def steps_per_epoch(self) -> int:
        return self.num_prompts // self.batch_size

    def next_batch(self) -> list[int]:
        if self.position >= self.steps_per_epoch * self.batch_size:
            self.epoch += 1
            self.position = 0
        order = epoch_order(self.num_prompts, self.epoch, shuffle=self.shuffle, seed=self.seed)
        batch = order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.steps_per_epoch * self.batch_size:
            raise ValueError(
                f"sampler state {state} does not fit {self.num_prompts} prompts in batches of {self.batch_size}"
            )
        self.epoch, self.position = epoch, position
