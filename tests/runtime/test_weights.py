"""Weights out of the sharded trainer: HF names, merged LoRA == peft forward, layered == streamed."""

from __future__ import annotations

import pytest

from rlplan.planner.phases import SyncMode
from rlplan.runtime.weights import hf_name

pytestmark = pytest.mark.runtime


def test_hf_name_strips_peft_wrapping_and_drops_lora_tensors():
    assert hf_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert hf_name("base_model.model.lm_head.weight") == "lm_head.weight"
    assert hf_name("model.norm.weight") == "model.norm.weight"
    assert hf_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") is None


def _export_on_rank(rank: int, world_size: int, model_dir: str, adapter_dir: str) -> dict:
    import torch
    from safetensors.torch import save_file

    from rlplan.runtime.trainer.policy import PolicyTrainer
    from rlplan.runtime.weights import adapter_config, adapter_tensors, iter_hf_weights
    from tests.runtime.test_trainer import _batch, _plan

    trainer = PolicyTrainer(_plan(model_dir), device=torch.device("cpu"), device_type="cpu", rank=rank)
    batch = _batch(0)
    old, _ = trainer.compute_log_probs(batch)
    batch = batch.with_fields(old_log_probs=old, ref_log_probs=trainer.compute_ref_log_probs(batch))
    trainer.update(batch, step=0)  # a non-zero adapter
    trained, _ = trainer.compute_log_probs(batch)
    streamed = dict(iter_hf_weights(trainer.model, mode=SyncMode.MERGED))
    layered = dict(iter_hf_weights(trainer.model, mode=SyncMode.MERGED, layered=True))
    base = dict(iter_hf_weights(trainer.model, mode=SyncMode.BASE))
    adapter = adapter_tensors(trainer.model)
    if rank == 0:
        import json
        import os

        os.makedirs(adapter_dir, exist_ok=True)
        save_file({k: v.contiguous() for k, v in adapter.items()}, os.path.join(adapter_dir, "adapter_model.safetensors"))
        with open(os.path.join(adapter_dir, "adapter_config.json"), "w") as handle:
            json.dump(adapter_config(trainer.model), handle)
    return {"trained": trained, "batch": batch, "streamed": streamed, "layered": layered, "base": base, "adapter_keys": sorted(adapter)}


def test_merged_weights_reproduce_the_peft_forward_and_the_adapter_loads_in_peft(tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlplan.runtime.trainer.forward import ForwardOptions, policy_forward
    from rlplan.runtime.trainer.local_group import run_on_local_group

    adapter_dir = str(tmp_path / "adapter")
    rank0, rank1 = run_on_local_group(_export_on_rank, 2, tiny_model_dir, adapter_dir)
    streamed, layered, base = rank0["streamed"], rank0["layered"], rank0["base"]
    batch, trained = rank0["batch"], rank0["trained"]
    mask = batch.response_mask

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert set(streamed) == set(plain.state_dict()) == set(layered) == set(base)
    assert all(torch.equal(streamed[k], layered[k]) for k in streamed)
    assert all(torch.equal(streamed[k], rank1["streamed"][k]) for k in streamed)
    # The base mode is the untouched checkpoint (LoRA trains only the adapter).
    assert all(torch.equal(base[k], plain.state_dict()[k]) for k in base)
    assert any(not torch.equal(streamed[k], base[k]) for k in streamed)
    assert rank0["adapter_keys"] and all("lora_" in k for k in rank0["adapter_keys"])

    options = ForwardOptions(remove_padding=True)
    merged_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    merged_model.load_state_dict(streamed)
    with torch.no_grad():
        merged, _ = policy_forward(merged_model.eval(), batch, "cpu", options, with_entropy=False)
    assert float(((merged - trained).abs() * mask).max()) < 1e-4

    peft_model = PeftModel.from_pretrained(plain, adapter_dir).eval()
    with torch.no_grad():
        from_adapter, _ = policy_forward(peft_model, batch, "cpu", options, with_entropy=False)
    assert float(((from_adapter - trained).abs() * mask).max()) < 1e-4
