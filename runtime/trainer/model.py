"""Building one rank's model: load from a local directory, wrap in LoRA, shard with FSDP2.

Sharding follows verl/torchtitan: `fully_shard` on every decoder layer, on the
input embedding when it is not tied to the LM head, then on the root, so one
layer's parameters are gathered at a time in forward and backward.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import ComputeDtype, LoraConfig

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig as PeftLoraConfig
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from transformers import PretrainedConfig


@frozen(kw_only=True)
class ShardingSpec:
    """How a model is sharded and where its tensors live."""

    device_type: str
    world_size: int
    # Ranks per shard group; world_size means plain FSDP, fewer means HSDP (replicate across groups).
    shard_group_size: int
    # The role's compute_dtype: "bfloat16" all-gathers bf16 copies of the fp32 shards for forward and
    # backward (FSDP2's MixedPrecisionPolicy, verl's fsdp_config.dtype); "float32" computes on the shards.
    compute_dtype: ComputeDtype
    param_offload: bool = False
    # True frees every group's gathered weights after its forward, the root's too (torch >= 2.8): what verl's
    # apply_fsdp2 passes (fsdp_config.reshard_after_forward) and what `rlplan measure` builds with, priced by
    # the planner per target stack (stack.ROOT_RESHARDS_AFTER_FORWARD). None is FSDP2's "auto", which keeps the
    # root group (lm_head, final norm, a tied embedding) gathered from forward to backward, as torch < 2.8 did
    # for an explicit True too.
    reshard_after_forward: bool | None = True

    @property
    def replicate_group_count(self) -> int:
        return self.world_size // self.shard_group_size


def check_model_dir(path: str) -> None:
    """The runtime loads only local directories: no hub downloads at run time."""
    if not path:
        raise PlanError(
            field="model.path",
            message="the plan names no model directory; the runtime loads weights from a local directory only.",
            fix="set model.path to a directory holding config.json and the safetensors weights",
        )
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
        raise PlanError(
            field="model.path",
            message=f"{path!r} is not a local model directory with a config.json (the runtime never downloads from a hub).",
            fix="download the model first (e.g. `huggingface-cli download <repo> --local-dir <dir>`) and set model.path to that directory",
        )


def lora_target_modules(target_modules: tuple[str, ...]) -> str | list[str]:
    # peft spells "every linear layer but the LM head" as the string "all-linear", not a one-item list.
    if tuple(target_modules) == ("all-linear",):
        return "all-linear"
    return list(target_modules)


def lora_peft_config(lora: LoraConfig) -> PeftLoraConfig:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=lora_target_modules(lora.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def load_hf_model(path: str, *, value_head: bool, train_dtype: torch.dtype) -> nn.Module:
    """A causal LM, or for the critic the same backbone with a one-output token head."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    check_model_dir(path)
    if value_head:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        config.num_labels = 1
        # Dropout in the value head would make values depend on the forward call.
        config.classifier_dropout = 0.0
        model = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=train_dtype, local_files_only=True
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=train_dtype, local_files_only=True)
    model.config.use_cache = False
    return model


def hf_model_on_meta(config: PretrainedConfig) -> nn.Module:
    """A causal LM of `config`'s shapes on the meta device, in the default dtype, without weights: what
    `rlplan measure` shards over fake tensors (runtime.measured_step)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks, found through the model's own `_no_split_modules`."""
    names = set(getattr(base_model(model), "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise PlanError(
            field="model.path",
            message=f"cannot find the decoder layers of {type(base_model(model)).__name__} to shard them.",
            fix="use a Hugging Face decoder model whose class lists _no_split_modules",
        )
    return layers


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper, or the model itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if get_base is not None else model


def apply_lora(model: nn.Module, lora: LoraConfig, *, gradient_checkpointing: bool) -> nn.Module:
    from peft import get_peft_model

    if gradient_checkpointing:
        # With a frozen embedding no input requires grad, and checkpointed layers would get no gradient.
        model.enable_input_require_grads()
    return get_peft_model(model, lora_peft_config(lora))


def enable_gradient_checkpointing(model: nn.Module) -> None:
    base_model(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def device_mesh(spec: ShardingSpec) -> DeviceMesh:
    from torch.distributed.device_mesh import init_device_mesh

    if spec.replicate_group_count == 1:
        return init_device_mesh(spec.device_type, (spec.world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(
        spec.device_type,
        (spec.replicate_group_count, spec.shard_group_size),
        mesh_dim_names=("replicate", "shard"),
    )


def shard_model(model: nn.Module, spec: ShardingSpec, mesh: DeviceMesh) -> nn.Module:
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    options: dict[str, object] = {"mesh": mesh, "reshard_after_forward": spec.reshard_after_forward}
    if spec.compute_dtype == "bfloat16":
        # Reducing gradients in fp32 keeps small LoRA gradients from rounding away across ranks.
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    options["offload_policy"] = CPUOffloadPolicy(pin_memory=True) if spec.param_offload else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    base = base_model(model)
    if not base.config.tie_word_embeddings:
        # A tied embedding must stay in the root's group, together with the LM head that shares it.
        fully_shard(base.get_input_embeddings(), **options)
    fully_shard(model, **options)
    return model


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
