"""The per-step batch statistics runtime/loop.py writes into metrics.jsonl (no engine, no workers)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_step_record_holds_the_prompt_and_response_lengths_the_batch_had():
    from rlplan.runtime.loop import _batch_statistics
    from rlplan.runtime.trainer.token_batch import token_batch_from_sequences

    prompts = [[1] * 3, [2] * 5, [3] * 10]
    responses = [[7] * 4, [8] * 1, [9] * 7]
    batch = token_batch_from_sequences(prompts, responses)
    mask = batch.response_mask
    batch = batch.with_fields(entropy=torch.zeros(mask.shape), advantages=torch.ones(mask.shape))
    record = _batch_statistics(batch, torch.tensor([0.0, 1.0, 0.5]), mask)
    assert record["prompt_length_mean"] == pytest.approx(6.0)
    assert record["prompt_length_max"] == 10.0
    assert record["response_length_mean"] == pytest.approx(4.0)
    assert record["response_length_max"] == 7.0
    assert record["sequences"] == 3.0
