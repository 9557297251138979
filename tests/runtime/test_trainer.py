"""The sharded trainer on two gloo ranks: packing, reference, split-invariant updates, skipped steps."""

from __future__ import annotations

import attrs
import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")

pytestmark = pytest.mark.runtime


def _plan(model_dir: str, **actor_changes):
    from rlplan.runtime.demo_workload import demo_plan

    plan = demo_plan(model_dir, "unused.parquet", "unused-output", steps=1, train_batch_size=4, n=4)
    # One mini batch per update: 4 prompts x 4 samples / 2 ranks = the 8 sequences each rank holds.
    return plan.evolve(actor=attrs.evolve(plan.actor, **{"ppo_mini_batch_size": 4, **actor_changes}))


def _batch(rank: int, with_training_fields: bool = True):
    import torch

    from rlplan.runtime.trainer.token_batch import token_batch_from_sequences

    generator = torch.Generator().manual_seed(100 + rank)
    prompts = [torch.randint(5, 300, (int(torch.randint(3, 12, (1,), generator=generator)),), generator=generator).tolist() for _ in range(8)]
    responses = [torch.randint(5, 300, (int(torch.randint(1, 8, (1,), generator=generator)),), generator=generator).tolist() for _ in range(8)]
    batch = token_batch_from_sequences(prompts, responses)
    if with_training_fields:
        mask = batch.response_mask
        batch = batch.with_fields(advantages=torch.randn(mask.shape, generator=generator) * mask)
    return batch


def _checks_on_rank(rank: int, world_size: int, model_dir: str) -> dict:
    import torch

    from rlplan.runtime.trainer.forward import ForwardOptions
    from rlplan.runtime.trainer.policy import PolicyTrainer

    results = {}
    trainer = PolicyTrainer(_plan(model_dir), device=torch.device("cpu"), device_type="cpu", rank=rank)
    batch = _batch(rank)
    mask = batch.response_mask
    packed, entropy = trainer.compute_log_probs(batch)
    trainer.forward_options = ForwardOptions(remove_padding=False)
    padded, _ = trainer.compute_log_probs(batch)
    trainer.forward_options = ForwardOptions(remove_padding=True)
    results["packed_vs_padded"] = float(((packed - padded).abs() * mask).max())
    results["entropy_positive"] = bool(((entropy * mask) >= 0).all() and (entropy * mask).sum() > 0)

    # A fresh LoRA adapter (B = 0) leaves the reference (adapter disabled) equal to the actor.
    reference = trainer.compute_ref_log_probs(batch)
    results["fresh_adapter_vs_reference"] = float(((packed - reference).abs() * mask).max())
    batch = batch.with_fields(old_log_probs=packed, ref_log_probs=reference)
    update = trainer.update(batch, step=0)
    after, _ = trainer.compute_log_probs(batch)
    results["moved_after_update"] = float(((after - packed).abs() * mask).max())
    results["grad_norm"] = update.metrics["actor/grad_norm"]
    results["scores_only_on_policy"] = update.log_probs is None and update.entropy is None
    results["reference_unchanged"] = float(((trainer.compute_ref_log_probs(batch) - reference).abs() * mask).max())
    return results


def _updates_on_rank(rank: int, world_size: int, model_dir: str, variants: list) -> list:
    """Per (actor_changes, poison[, on_policy]) variant: skipped steps, the parameters after, the gradients the
    optimizer stepped with, the update's metrics, the old log-probs and what the update returned for them.

    on_policy drops old_log_probs from the batch, so the update takes its own detached log-probs instead."""
    import torch

    from rlplan.runtime.trainer.policy import PolicyTrainer
    from rlplan.runtime.trainer.token_batch import TokenBatch
    from rlplan.runtime.weights import full

    outcomes = []
    for actor_changes, poison, *on_policy in variants:
        trainer = PolicyTrainer(_plan(model_dir, **actor_changes), device=torch.device("cpu"), device_type="cpu", rank=rank)
        batch = _batch(rank)
        old, _ = trainer.compute_log_probs(batch)
        batch = batch.with_fields(old_log_probs=old, ref_log_probs=trainer.compute_ref_log_probs(batch))
        if poison:
            batch = batch.with_fields(advantages=batch["advantages"] * float("nan"))
        trainable = [p for p in trainer.model.parameters() if p.requires_grad]
        stepped_with: list = []
        optimizer_step = trainer.optimizer.step

        def recording_step(*args, _step=optimizer_step, _into=stepped_with, _params=trainable, **kwargs):
            _into.extend(full(p.grad).detach().clone() for p in _params)
            return _step(*args, **kwargs)

        trainer.optimizer.step = recording_step
        if on_policy and on_policy[0]:
            batch = TokenBatch({name: t for name, t in batch.tensors.items() if name != "old_log_probs"})
        update = trainer.update(batch, step=0)
        outcomes.append((update.metrics["actor/skipped_steps"], [full(p).detach().clone() for p in trainable],
                         stepped_with, update.metrics, old * batch.response_mask, update.log_probs))
    return outcomes


def test_packed_forward_matches_padded_and_reference_is_adapter_off(tiny_model_dir):
    from rlplan.runtime.trainer.local_group import run_on_local_group

    for result in run_on_local_group(_checks_on_rank, 2, tiny_model_dir):
        assert result["packed_vs_padded"] < 1e-4
        assert result["entropy_positive"]
        assert result["fresh_adapter_vs_reference"] == 0.0
        assert result["moved_after_update"] > 1e-3
        assert result["reference_unchanged"] == 0.0
        assert result["grad_norm"] > 0
        assert result["scores_only_on_policy"]


def test_update_is_invariant_to_the_micro_batch_split_and_skips_non_finite_gradients(tiny_model_dir):
    import torch

    from rlplan.runtime.trainer.local_group import run_on_local_group

    # One mini batch of 8 sequences per rank: in 1 micro batch, in 4, and by a token budget.
    variants = [
        ({"ppo_micro_batch_size_per_gpu": 8}, False),
        ({"ppo_micro_batch_size_per_gpu": 2}, False),
        ({"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 24}, False),
        ({}, True),
        ({"lr": 0.0}, False),
    ]
    whole, split, budget, poisoned, initial = run_on_local_group(_updates_on_rank, 2, tiny_model_dir, variants)[0]
    # Adam's first step is about lr * sign(g), which amplifies rounding noise: compare the gradients.
    for other in (split, budget):
        assert len(whole[2]) == len(other[2]) > 0
        for a, b in zip(whole[2], other[2], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert poisoned[0] == 1.0 and whole[0] == 0.0 and poisoned[2] == []
    for a, b in zip(poisoned[1], initial[1], strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(whole[1], initial[1], strict=True))


def test_on_policy_update_without_old_log_probs_has_the_same_loss_and_gradients(tiny_model_dir):
    import torch

    from rlplan.runtime.trainer.local_group import run_on_local_group

    # One mini batch per rank (on-policy): with the old-log-prob pass, and without it in 1 and in 4 micro batches.
    variants = [
        ({"ppo_micro_batch_size_per_gpu": 8}, False, False),
        ({"ppo_micro_batch_size_per_gpu": 8}, False, True),
        ({"ppo_micro_batch_size_per_gpu": 2}, False, True),
    ]
    for with_pass, *shortcuts in run_on_local_group(_updates_on_rank, 2, tiny_model_dir, variants):
        assert with_pass[5] is None
        for shortcut in shortcuts:
            assert len(shortcut[2]) == len(with_pass[2]) > 0
            for a, b in zip(with_pass[2], shortcut[2], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
            for key in ("actor/pg_loss", "actor/grad_norm"):
                assert abs(shortcut[3][key]) > 0
                assert shortcut[3][key] == pytest.approx(with_pass[3][key], rel=1e-4, abs=1e-7), key
            # The update's own log-probs are the old ones the skipped pass would have given.
            torch.testing.assert_close(shortcut[5] * (with_pass[4] != 0), with_pass[4], rtol=1e-5, atol=1e-5)


def test_an_update_with_several_optimizer_steps_needs_old_log_probs(tiny_model_dir):
    from rlplan.runtime.trainer.local_group import run_on_local_group

    with pytest.raises(Exception, match="needs an on-policy update"):
        run_on_local_group(_updates_on_rank, 2, tiny_model_dir, [({"ppo_epochs": 2}, False, True)])


def test_the_shortcut_applies_exactly_to_one_optimizer_step_without_kl_in_the_reward(tiny_model_dir):
    from rlplan.planner.layout import reuses_update_log_probs

    plan = _plan(tiny_model_dir)
    assert reuses_update_log_probs(plan)
    assert not reuses_update_log_probs(plan.evolve(actor=attrs.evolve(plan.actor, ppo_epochs=2)))
    assert not reuses_update_log_probs(plan.evolve(actor=attrs.evolve(plan.actor, ppo_mini_batch_size=2)))
    kl_in_reward = attrs.evolve(plan.algorithm, use_kl_in_reward=True)
    assert not reuses_update_log_probs(plan.evolve(algorithm=kl_in_reward))


def _compute_dtype_on_rank(rank: int, world_size: int, model_dir: str) -> dict:
    import torch

    from rlplan.runtime.trainer.policy import PolicyTrainer

    batch = _batch(rank)
    mask = batch.response_mask
    results = {}
    for dtype in ("float32", "bfloat16"):
        plan = _plan(model_dir, compute_dtype=dtype, use_kl_loss=False)
        trainer = PolicyTrainer(plan, device=torch.device("cpu"), device_type="cpu", rank=rank)
        seen: list = []

        def record(module, args, output, seen=seen) -> None:
            seen.append((output[0] if isinstance(output, tuple) else output).dtype)

        first_layer = next(m for name, m in trainer.model.named_modules() if name.endswith("layers.0"))
        first_layer.register_forward_hook(record)
        log_probs, _ = trainer.compute_log_probs(batch)
        update = trainer.update(batch.with_fields(old_log_probs=log_probs), step=0)
        results[dtype] = {
            "layer_output": str(seen[0]),
            "log_probs": str(log_probs.dtype),
            "shards": sorted({str(p.dtype) for p in trainer.model.parameters()}),
            "grad_norm": update.metrics["actor/grad_norm"],
            "values": log_probs * mask,
        }
    results["bf16_vs_fp32"] = float((results["float32"].pop("values") - results["bfloat16"].pop("values")).abs().max())
    return results


def test_the_trainer_computes_its_layers_in_the_plans_compute_dtype_on_fp32_shards(tiny_model_dir):
    """actor.compute_dtype bfloat16 all-gathers bf16 copies of the fp32 shards (verl's fsdp_config.dtype);
    float32 computes on the shards. Log-probs and AdamW's state stay fp32 either way."""
    import math

    from rlplan.runtime.trainer.local_group import run_on_local_group

    for result in run_on_local_group(_compute_dtype_on_rank, 2, tiny_model_dir):
        assert result["float32"]["layer_output"] == "torch.float32"
        assert result["bfloat16"]["layer_output"] == "torch.bfloat16"
        for dtype in ("float32", "bfloat16"):
            assert result[dtype]["log_probs"] == "torch.float32" and result[dtype]["shards"] == ["torch.float32"]
            assert math.isfinite(result[dtype]["grad_norm"]) and result[dtype]["grad_norm"] > 0
        # The same weights and tokens: bf16 rounding moves the log-probs a little, and only a little.
        assert 0 < result["bf16_vs_fp32"] < 0.25
