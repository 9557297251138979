"""Checkpoints: complete-or-invisible directories, and a bit-exact restore of the sharded training state."""

from __future__ import annotations

import pytest

from rlplan.runtime import checkpoint

pytestmark = pytest.mark.runtime


def test_only_renamed_checkpoints_with_trainer_state_count(tmp_path):
    assert checkpoint.latest_complete_checkpoint(tmp_path) is None
    staging = checkpoint.begin_checkpoint(tmp_path, 2)
    (staging / "shard").write_text("x")
    # A save that died before commit: staging only, never reported.
    assert staging.name == ".tmp-step-2"
    assert checkpoint.latest_complete_checkpoint(tmp_path) is None
    final = checkpoint.commit_checkpoint(tmp_path, 2, {"sampler": {"epoch": 0, "position": 8}})
    assert final.name == "step-2" and not staging.exists()
    assert checkpoint.read_trainer_state(final) == {"sampler": {"epoch": 0, "position": 8}, "step": 2}
    # A directory that looks like a checkpoint but has no trainer state (e.g. copied by hand) is ignored too.
    (checkpoint.checkpoint_root(tmp_path) / "step-9").mkdir()
    assert checkpoint.latest_complete_checkpoint(tmp_path) == final


def test_a_new_save_replaces_a_crashed_staging_directory_and_old_checkpoints_are_pruned(tmp_path):
    for step in (1, 2, 3):
        stale = checkpoint.staging_dir(tmp_path, step)
        stale.mkdir(parents=True)
        (stale / "half-written").write_text("")
        staging = checkpoint.begin_checkpoint(tmp_path, step)
        assert not (staging / "half-written").exists()
        checkpoint.commit_checkpoint(tmp_path, step, {}, keep=2)
    assert [step for step, _ in checkpoint.complete_checkpoints(tmp_path)] == [2, 3]


def _save_and_restore_on_rank(rank: int, world_size: int, model_dir: str, directory: str, lora_rank: int) -> dict:
    """Train 1 step, save, train 1 more; a fresh trainer restored from the save must redo step 2 exactly."""
    from pathlib import Path

    import attrs
    import torch

    from rlplan.runtime.trainer.policy import PolicyTrainer
    from rlplan.runtime.weights import full
    from tests.runtime.test_trainer import _batch, _plan

    plan = _plan(model_dir, lr_warmup_steps=3, shuffle=True)
    plan = plan.evolve(model=attrs.evolve(plan.model, lora=attrs.evolve(plan.model.lora, rank=lora_rank)))

    def prepared(trainer):
        batch = _batch(rank)
        old, _ = trainer.compute_log_probs(batch)
        return batch.with_fields(old_log_probs=old, ref_log_probs=old)

    def trainable(trainer):
        return [full(p).detach().clone() for p in trainer.model.parameters() if p.requires_grad]

    first = PolicyTrainer(plan, device=torch.device("cpu"), device_type="cpu", rank=rank)
    first.update(prepared(first), step=0)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    checkpoint.save_training_state(path, "actor", first.model, first.optimizer, first.scheduler, rank)
    saved_draw = torch.rand(3)
    first.update(prepared(first), step=1)
    expected = trainable(first)

    torch.manual_seed(1234)  # a different RNG state, and a fresh adapter/optimizer, to be overwritten
    second = PolicyTrainer(plan, device=torch.device("cpu"), device_type="cpu", rank=rank)
    checkpoint.load_training_state(path, "actor", second.model, second.optimizer, second.scheduler, rank)
    restored_draw = torch.rand(3)
    second.update(prepared(second), step=1)
    got = trainable(second)
    return {
        "equal": all(torch.equal(a, b) for a, b in zip(expected, got, strict=True)),
        "rng_equal": torch.equal(saved_draw, restored_draw),
        "lr": second.scheduler.get_last_lr()[0],
        "base_lr": plan.actor.lr,
        "count": len(got),
    }


@pytest.mark.parametrize("lora_rank", [8, 0], ids=["lora", "full"])
def test_restore_is_bit_exact_for_model_optimizer_scheduler_and_rng(tiny_model_dir, tmp_path, lora_rank):
    from rlplan.runtime.trainer.local_group import run_on_local_group

    results = run_on_local_group(_save_and_restore_on_rank, 2, tiny_model_dir, str(tmp_path / "ckpt"), lora_rank)
    for result in results:
        assert result["count"] > 0
        assert result["equal"], "the restored trainer diverged from the uninterrupted one"
        assert result["rng_equal"]
        # Warmup of 3 optimizer steps: after 2 steps the scheduler must be at 3/3 of the base lr, not restarted.
        assert result["lr"] == pytest.approx(result["base_lr"])


PROBE_IDS = list(range(5, 37))
SHARD_BYTES = 1_000_000  # the tiny model is a few MB in fp32: forces several shards


def _export_on_rank(rank: int, world_size: int, model_dir: str, directory: str, lora_rank: int) -> dict:
    """Train one step (so the weights differ from the source), export, and return the trained model's logits."""
    from pathlib import Path

    import attrs
    import torch

    from rlplan.runtime.trainer.policy import PolicyTrainer
    from tests.runtime.test_trainer import _batch, _plan

    plan = _plan(model_dir)
    plan = plan.evolve(model=attrs.evolve(plan.model, lora=attrs.evolve(plan.model.lora, rank=lora_rank)))
    trainer = PolicyTrainer(plan, device=torch.device("cpu"), device_type="cpu", rank=rank)
    batch = _batch(rank)
    old, _ = trainer.compute_log_probs(batch)
    trainer.update(batch.with_fields(old_log_probs=old, ref_log_probs=old), step=0)
    path = Path(directory)
    if lora_rank:
        checkpoint.export_adapter(path, trainer.model, rank)
    else:
        checkpoint.export_hf_model(path, trainer.model, model_dir, rank, max_shard_size=SHARD_BYTES)
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([PROBE_IDS])).logits
    return {"logits": logits}


def _logits(model):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([PROBE_IDS])).logits


def test_lora_export_is_peft_save_pretrained_and_loads_with_the_trained_logits(tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlplan.runtime.trainer.local_group import run_on_local_group

    results = run_on_local_group(_export_on_rank, 2, tiny_model_dir, str(tmp_path), 8)
    adapter_dir = tmp_path / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter_dir.iterdir()}
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    base_logits = _logits(base)
    loaded = PeftModel.from_pretrained(base, str(adapter_dir))
    trained = results[0]["logits"]
    assert not torch.allclose(trained, base_logits, atol=1e-4), "the training step left the adapter at zero"
    torch.testing.assert_close(_logits(loaded), trained, atol=1e-5, rtol=1e-5)


def test_full_export_is_sharded_safetensors_with_an_index_that_from_pretrained_loads(tiny_model_dir, tmp_path):
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from rlplan.runtime.trainer.local_group import run_on_local_group

    results = run_on_local_group(_export_on_rank, 2, tiny_model_dir, str(tmp_path), 0)
    hf_dir = tmp_path / "hf"
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((hf_dir / shard).is_file() for shard in shards)
    assert all(name.startswith("model-") and name.endswith(f"-of-{len(shards):05d}.safetensors") for name in shards)
    assert not (hf_dir / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    source = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trained = results[0]["logits"]
    assert not torch.allclose(trained, _logits(source), atol=1e-4), "the training step left the weights unchanged"
    torch.testing.assert_close(_logits(loaded), trained, atol=1e-5, rtol=1e-5)
