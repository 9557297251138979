"""One trained role's model on this rank, built the same way for the actor and the critic.

A `RoleModelSpec` is what the plan asks of a role (weights, value head, LoRA, Ulysses,
gradient checkpointing, sharding, optimizer); `build_role_model` turns it into the sharded
model with its optimizer, in an order every rank follows: process groups first (each rank
must create all of them, in the same order), then the seeded load, the wrappers, sharding,
and the optimizer over what is left trainable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from attrs import frozen

from rlplan.planner.layout import ParallelLayout, PlanLayout
from rlplan.planner.plan import ComputeDtype, LoraConfig, Plan
from rlplan.runtime.trainer.model import (
    ShardingSpec,
    apply_lora,
    device_mesh,
    enable_gradient_checkpointing,
    load_hf_model,
    shard_model,
    trainable_parameters,
)
from rlplan.runtime.trainer.optimization import OptimizerSettings, UpdateSummary, build_optimizer, ppo_update
from rlplan.runtime.trainer.sequence_parallel import (
    SequenceParallelGroup,
    data_parallel_rank,
    new_sequence_parallel_group,
    use_ulysses_attention,
)
from rlplan.runtime.trainer.varlen_attention import use_varlen_attention

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.optim.lr_scheduler import LRScheduler

    from rlplan.planner.layout import RoleBatchLayout
    from rlplan.runtime.trainer.token_batch import TokenBatch


@frozen(kw_only=True)
class RoleModelSpec:
    """What the plan asks of one trained role's model on a machine of `sharding.device_type`."""

    path: str
    # The critic is the actor's backbone with a one-output token head (as verl's critic).
    value_head: bool
    # Seeds the fresh weights (LoRA adapter, value head): every rank must draw the same ones before
    # sharding splits them.
    init_seed: int
    ulysses_size: int
    # Packed (remove padding) micro batches: on CPU they attend one sequence at a time (varlen_attention).
    remove_padding: bool
    # None: the role trains all its weights.
    lora: LoraConfig | None
    gradient_checkpointing: bool
    sharding: ShardingSpec
    optimizer: OptimizerSettings


@frozen(kw_only=True)
class RoleModel:
    """A role's sharded model on this rank with the mesh, groups and optimizer built for it."""

    model: nn.Module
    mesh: DeviceMesh
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    sequence_parallel: SequenceParallelGroup | None
    # The data-parallel shard this rank trains on (ranks of one Ulysses group share one).
    data_rank: int


def sharding_spec(parallel: ParallelLayout, device_type: str, *, param_offload: bool,
                  compute_dtype: ComputeDtype) -> ShardingSpec:
    return ShardingSpec(
        device_type=device_type,
        world_size=parallel.world_size,
        shard_group_size=parallel.fsdp_shard_size,
        compute_dtype=compute_dtype,
        param_offload=param_offload,
    )


def actor_model_spec(plan: Plan, layout: PlanLayout, device_type: str) -> RoleModelSpec:
    actor = plan.actor
    return RoleModelSpec(
        path=plan.model.path,
        value_head=False,
        init_seed=plan.trainer.seed,
        ulysses_size=layout.parallel.ulysses_sequence_parallel_size,
        remove_padding=plan.model.use_remove_padding,
        lora=plan.model.lora if plan.model.lora.enabled else None,
        gradient_checkpointing=plan.model.gradient_checkpointing,
        # This runtime's param_offload already shards with FSDP2's CPUOffloadPolicy, which is what verl's
        # offload_policy turns on (the optimizer then steps on the host-resident shards).
        sharding=sharding_spec(layout.parallel, device_type, param_offload=actor.param_offload or actor.offload_policy,
                               compute_dtype=actor.compute_dtype),
        optimizer=OptimizerSettings(
            lr=actor.lr,
            weight_decay=actor.weight_decay,
            warmup_steps=actor.lr_warmup_steps,
            grad_clip=actor.grad_clip,
            offload_state=actor.optimizer_offload and not actor.offload_policy and device_type != "cpu",
        ),
    )


def critic_model_spec(plan: Plan, layout: PlanLayout, device_type: str) -> RoleModelSpec:
    if layout.critic_parallel is None:
        raise ValueError("the plan uses no critic")
    critic = plan.critic
    return RoleModelSpec(
        path=plan.model.path,
        value_head=True,
        # Not the actor's seed: the value head is a fresh draw of its own.
        init_seed=plan.trainer.seed + 1,
        ulysses_size=layout.critic_parallel.ulysses_sequence_parallel_size,
        remove_padding=critic.use_remove_padding,
        lora=None,
        gradient_checkpointing=critic.gradient_checkpointing,
        # CPUOffloadPolicy either way: see actor_model_spec.
        sharding=sharding_spec(
            layout.critic_parallel, device_type, param_offload=critic.param_offload or critic.offload_policy,
            compute_dtype=critic.compute_dtype,
        ),
        optimizer=OptimizerSettings(
            lr=critic.lr,
            grad_clip=critic.grad_clip,
            offload_state=critic.optimizer_offload and not critic.offload_policy and device_type != "cpu",
        ),
    )


def use_packed_attention(model: nn.Module, *, remove_padding: bool, device_type: str,
                         sequence_parallel: SequenceParallelGroup | None) -> None:
    """The attention a trainer model runs: Ulysses with sequence parallelism, varlen for packed CPU inputs.

    On an accelerator, sdpa with the block-diagonal mask stays: its kernels are fast there, and a
    per-sequence loop would launch 3 kernels per sequence and layer. The choice lives here, the one place a
    role's model is built, so that the two attention modules need not import each other.
    """
    if sequence_parallel is not None:
        use_ulysses_attention(model, sequence_parallel.size)
    elif remove_padding and device_type == "cpu":
        use_varlen_attention(model)


def load_with_attention(path: str, *, value_head: bool, remove_padding: bool, device_type: str,
                        sequence_parallel: SequenceParallelGroup | None) -> nn.Module:
    """The Hugging Face model in fp32 with the attention its inputs need: Ulysses where the role splits
    sequences, one SDPA per sequence for packed inputs on CPU (never an (S, S) mask there)."""
    import torch

    model = load_hf_model(path, value_head=value_head, train_dtype=torch.float32)
    use_packed_attention(model, remove_padding=remove_padding, device_type=device_type,
                         sequence_parallel=sequence_parallel)
    return model


def place_and_shard(model: nn.Module, spec: ShardingSpec, mesh: DeviceMesh, device: torch.device | str) -> nn.Module:
    # With param offload FSDP2 moves each shard to the host itself; the whole model never goes to the device.
    return shard_model(model if spec.param_offload else model.to(device), spec, mesh)


def wrap_for_training(model: nn.Module, *, lora: LoraConfig | None, gradient_checkpointing: bool) -> nn.Module:
    """LoRA, then gradient checkpointing: what a trained model goes through before it is sharded (the run's
    loaded model and `rlplan measure`'s model on the meta device alike)."""
    if lora is not None:
        model = apply_lora(model, lora, gradient_checkpointing=gradient_checkpointing)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def shard_on_meta(model: nn.Module, spec: ShardingSpec, mesh: DeviceMesh, device: torch.device | str) -> nn.Module:
    """Shard a model built on the meta device, then allocate its shards on `device` (uninitialised; fake
    under a FakeTensorMode): `rlplan measure`'s emulation, which never loads weights."""
    model = shard_model(model, spec, mesh)
    model.to_empty(device=device)
    return model


def build_role_model(spec: RoleModelSpec, *, device: torch.device | str, rank: int) -> RoleModel:
    import torch

    sharding = spec.sharding
    sequence_parallel = new_sequence_parallel_group(sharding.world_size, spec.ulysses_size, rank)
    mesh = device_mesh(sharding)
    torch.manual_seed(spec.init_seed)
    model = load_with_attention(spec.path, value_head=spec.value_head, remove_padding=spec.remove_padding,
                                device_type=sharding.device_type, sequence_parallel=sequence_parallel)
    model = wrap_for_training(model, lora=spec.lora, gradient_checkpointing=spec.gradient_checkpointing)
    model = place_and_shard(model, sharding, mesh, device)
    optimizer, scheduler = build_optimizer(trainable_parameters(model), spec.optimizer)
    return RoleModel(
        model=model,
        mesh=mesh,
        optimizer=optimizer,
        scheduler=scheduler,
        sequence_parallel=sequence_parallel,
        data_rank=data_parallel_rank(sequence_parallel, rank),
    )


class RoleTrainer(ABC):
    """What the actor's and the critic's trainers share: the role's model built from its spec on this rank,
    and the PPO update loop over it (the subclass supplies the layouts and the per-micro-batch loss)."""

    def __init__(self, plan: Plan, spec: RoleModelSpec, *, device: torch.device | str, rank: int) -> None:
        self.plan = plan
        self.device = device
        self.rank = rank
        built = build_role_model(spec, device=device, rank=rank)
        self.model, self.mesh = built.model, built.mesh
        self.optimizer, self.scheduler, self.optimizer_settings = built.optimizer, built.scheduler, spec.optimizer
        self.sequence_parallel, self.data_rank = built.sequence_parallel, built.data_rank

    @abstractmethod
    def _micro_loss(self, micro: TokenBatch, normalizer: float) -> tuple[Tensor, dict[str, float]]:
        """The role's loss on one micro batch (normalized by the mini batch's global count) and its metrics."""

    def _ppo_update(self, batch: TokenBatch, *, role: RoleBatchLayout, world_size: int, seed: int,
                    activation_offload: bool = False) -> UpdateSummary:
        """ppo_update on this rank's share; `seed` draws the mini-batch shuffle (distinct per role, step and
        data rank, the same on the ranks of one Ulysses group)."""
        import torch

        return ppo_update(
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            settings=self.optimizer_settings,
            batch=batch,
            role=role,
            # verl's critic takes the actor's loss aggregation and shuffle (critic.loss_agg_mode follows
            # actor's in its config), so both roles read them from [actor].
            loss_agg_mode=self.plan.actor.loss_agg_mode,
            world_size=world_size,
            device=self.device,
            shuffle=self.plan.actor.shuffle,
            generator=torch.Generator().manual_seed(seed),
            micro_loss=self._micro_loss,
            activation_offload=activation_offload,
        )


def build_reference_model(
    plan: Plan, layout: PlanLayout, *, device_type: str, device: torch.device | str, mesh: DeviceMesh,
    sequence_parallel: SequenceParallelGroup | None,
) -> nn.Module:
    """A frozen copy of the actor's initial weights, sharded on the actor's mesh, in eval mode."""
    # As verl: on GPUs the reference always shards with CPU offload (planner.memory.fsdp.ref_params_on_host).
    spec = sharding_spec(layout.parallel, device_type, param_offload=plan.ref.param_offload or device_type != "cpu",
                         compute_dtype=plan.ref.compute_dtype)
    reference = load_with_attention(plan.model.path, value_head=False, remove_padding=plan.model.use_remove_padding,
                                    device_type=device_type, sequence_parallel=sequence_parallel)
    reference.requires_grad_(False)
    reference = place_and_shard(reference, spec, mesh, device)
    reference.eval()
    return reference
