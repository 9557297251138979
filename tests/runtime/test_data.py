"""verl-format datasets, prompt-length handling, and the resumable sampler."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import DataSection
from rlplan.runtime.data import PromptSampler, epoch_order, truncate_prompt


def _data(**changes) -> DataSection:
    values = {"train_batch_size": 4, "max_prompt_length": 64, "max_response_length": 4}
    values.update(changes)
    return DataSection(**values)


# --- truncation --------------------------------------------------------------------------------


@given(ids=st.lists(st.integers(0, 500), max_size=40), limit=st.integers(1, 30))
def test_truncation_keeps_at_most_the_limit_from_the_named_side(ids, limit):
    kept = min(len(ids), limit)
    assert truncate_prompt(ids, limit, "left") == tuple(ids[len(ids) - kept :])
    assert truncate_prompt(ids, limit, "right") == tuple(ids[:kept])
    middle = truncate_prompt(ids, limit, "middle")
    assert len(middle) == kept
    if len(ids) > limit:
        head = limit // 2
        assert middle[:head] == tuple(ids[:head]) and middle[head:] == tuple(ids[len(ids) - (limit - head) :])


# --- the sampler ---------------------------------------------------------------------------------


def _run(sampler: PromptSampler, steps: int) -> list[list[int]]:
    return [sampler.next_batch() for _ in range(steps)]


@given(
    num_prompts=st.integers(1, 40),
    batch_size=st.integers(1, 40),
    seed=st.integers(0, 5),
    shuffle=st.booleans(),
    steps=st.integers(1, 30),
)
def test_sampler_epochs_are_permutations_in_full_batches(num_prompts, batch_size, seed, shuffle, steps):
    if batch_size > num_prompts:
        with pytest.raises(PlanError):
            PromptSampler(num_prompts=num_prompts, batch_size=batch_size, seed=seed, shuffle=shuffle)
        return
    sampler = PromptSampler(num_prompts=num_prompts, batch_size=batch_size, seed=seed, shuffle=shuffle)
    batches = _run(sampler, steps)
    assert all(len(batch) == batch_size for batch in batches)
    per_epoch = sampler.steps_per_epoch
    for start in range(0, len(batches) - per_epoch + 1, per_epoch):
        seen = [index for batch in batches[start : start + per_epoch] for index in batch]
        assert len(set(seen)) == len(seen) == per_epoch * batch_size


@given(
    num_prompts=st.integers(1, 30),
    batch_size=st.integers(1, 10),
    seed=st.integers(0, 3),
    stop=st.integers(0, 25),
    more=st.integers(1, 15),
)
def test_sampler_resumed_from_its_state_sees_the_same_batches(num_prompts, batch_size, seed, stop, more):
    if batch_size > num_prompts:
        return
    reference = PromptSampler(num_prompts=num_prompts, batch_size=batch_size, seed=seed)
    expected = _run(reference, stop + more)[stop:]
    first = PromptSampler(num_prompts=num_prompts, batch_size=batch_size, seed=seed)
    _run(first, stop)
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = PromptSampler(num_prompts=num_prompts, batch_size=batch_size, seed=seed)
    resumed.load_state_dict(state)
    assert _run(resumed, more) == expected


def test_resume_at_the_end_of_an_epoch_continues_with_the_next_epoch():
    # verl#7401: resuming exactly at an epoch boundary trained zero steps.
    sampler = PromptSampler(num_prompts=8, batch_size=4, seed=1)
    epoch0 = _run(sampler, 2)
    assert sampler.state_dict() == {"epoch": 0, "position": 8}
    resumed = PromptSampler(num_prompts=8, batch_size=4, seed=1)
    resumed.load_state_dict(sampler.state_dict())
    batch = resumed.next_batch()
    assert len(batch) == 4 and resumed.epoch == 1
    assert batch == epoch_order(8, 1, shuffle=True, seed=1)[:4]
    assert sorted(epoch0[0] + epoch0[1]) == list(range(8))


def test_epoch_order_depends_on_epoch_and_seed_only_when_shuffling():
    assert epoch_order(50, 0, shuffle=True, seed=1) == epoch_order(50, 0, shuffle=True, seed=1)
    assert epoch_order(50, 0, shuffle=True, seed=1) != epoch_order(50, 1, shuffle=True, seed=1)
    assert epoch_order(50, 0, shuffle=True, seed=1) != epoch_order(50, 0, shuffle=True, seed=2)
    assert epoch_order(50, 3, shuffle=False, seed=1) == list(range(50))


def test_sampler_takes_batch_size_shuffle_and_seed_from_the_plan():
    sampler = PromptSampler.for_plan(10, _data(train_batch_size=5, shuffle=False, seed=7))
    assert (sampler.batch_size, sampler.shuffle, sampler.seed) == (5, False, 7)
    assert sampler.next_batch() == [0, 1, 2, 3, 4]


def test_sampler_rejects_a_state_from_another_dataset():
    sampler = PromptSampler(num_prompts=8, batch_size=4)
    with pytest.raises(ValueError):
        sampler.load_state_dict({"epoch": 0, "position": 12})


# --- reading and tokenizing datasets (needs the tokenizer stack) ---------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers", reason="tokenizing prompts needs the runtime extra (transformers)")
    from rlplan.runtime.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def toy_files(tmp_path_factory):
    pytest.importorskip("pyarrow", reason="verl datasets are parquet (pyarrow)")
    from rlplan.runtime.tiny import write_toy_dataset

    return write_toy_dataset(tmp_path_factory.mktemp("data") / "toy.parquet", num_prompts=10, seed=0)


def _long_row(words: int) -> dict:
    content = " ".join(["apples"] * words)
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {},
    }


@pytest.mark.runtime
def test_parquet_and_jsonl_load_to_the_same_tokenized_prompts(tokenizer, toy_files):
    from rlplan.runtime.data import load_prompt_dataset
    from rlplan.runtime.tiny import toy_records

    parquet_path, jsonl_path = toy_files
    from_parquet = load_prompt_dataset([parquet_path], tokenizer, _data())
    from_jsonl = load_prompt_dataset([jsonl_path], tokenizer, _data())
    assert from_parquet == from_jsonl and len(from_parquet) == 10
    first = from_parquet.records[0]
    assert first.ground_truth == toy_records(10, 0)[0]["reward_model"]["ground_truth"]
    rendered = tokenizer.decode(list(first.prompt_ids))
    assert rendered.endswith("<|im_start|>assistant\n") and f"letter {first.ground_truth}:" in rendered


@pytest.mark.runtime
@pytest.mark.parametrize(
    "how", [{"filter_overlong_prompts": True}, {"filter_overlong_prompts": False, "truncation": "filter"}]
)
def test_overlong_prompts_are_filtered_and_counted(tokenizer, how):
    from rlplan.runtime.data import build_prompt_dataset

    rows = [_long_row(2), _long_row(100), _long_row(3), _long_row(200)]
    dataset = build_prompt_dataset(rows, tokenizer, _data(max_prompt_length=40, **how))
    assert (len(dataset), dataset.num_filtered, dataset.num_truncated) == (2, 2, 0)
    assert [record.index for record in dataset.records] == [0, 2]


@pytest.mark.runtime
@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_overlong_prompts_are_truncated_and_counted(tokenizer, side):
    from rlplan.runtime.data import build_prompt_dataset, tokenize_prompt

    rows = [_long_row(2), _long_row(100)]
    dataset = build_prompt_dataset(
        rows, tokenizer, _data(max_prompt_length=40, filter_overlong_prompts=False, truncation=side)
    )
    assert (len(dataset), dataset.num_filtered, dataset.num_truncated) == (2, 0, 1)
    full = tokenize_prompt(tokenizer, rows[1]["prompt"])
    assert dataset.records[1].prompt_ids == truncate_prompt(full, 40, side)


@pytest.mark.runtime
def test_overlong_prompts_with_truncation_error_name_max_prompt_length(tokenizer):
    from rlplan.runtime.data import build_prompt_dataset

    rows = [_long_row(2), _long_row(100), _long_row(200)]
    with pytest.raises(PlanError) as raised:
        build_prompt_dataset(rows, tokenizer, _data(max_prompt_length=40, filter_overlong_prompts=False))
    assert raised.value.field == "data.max_prompt_length"
    assert "2 of 3 prompts" in raised.value.message and "filter_overlong_prompts" in raised.value.fix


def test_missing_columns_and_files_are_plan_errors(tmp_path):
    from rlplan.runtime.data import read_rows

    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"prompt": [], "data_source": "x"}) + "\n")
    with pytest.raises(PlanError, match="reward_model"):
        read_rows(broken)
    with pytest.raises(PlanError) as raised:
        read_rows(tmp_path / "absent.parquet")
    assert raised.value.field == "data.train_files"
