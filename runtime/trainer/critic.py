"""The PPO critic on one rank: the actor's backbone with a one-output token head.

Like verl, the critic starts from the actor's weights (model.path) with a fresh
value head, and is trained in full (no LoRA) with its own optimizer.
"""

from __future__ import annotations

from typing import Any

from rlplan.planner.layout import PlanLayout, plan_layout
from rlplan.planner.plan import Plan
from rlplan.runtime.trainer.forward import ForwardOptions, value_forward
from rlplan.runtime.trainer.micro_batches import micro_batch_indices
from rlplan.runtime.trainer.model import (
    ShardingSpec,
    device_mesh,
    enable_gradient_checkpointing,
    load_hf_model,
    shard_model,
    trainable_parameters,
)
from rlplan.runtime.trainer.optimization import OptimizerSettings, build_optimizer, ppo_update
from rlplan.runtime.trainer.policy import concat_rows
from rlplan.runtime.trainer.sequence_parallel import data_parallel_rank, new_sequence_parallel_group
from rlplan.runtime.trainer.token_batch import TokenBatch
from rlplan.runtime.trainer.varlen_attention import use_packed_attention


class CriticTrainer:
    def __init__(self, plan: Plan, *, device: Any, device_type: str, rank: int) -> None:
        import torch

        self.plan = plan
        self.device = device
        self.rank = rank
        self.layout: PlanLayout = plan_layout(plan)
        if self.layout.critic_update is None or self.layout.critic_values is None or self.layout.critic_parallel is None:
            raise ValueError("the plan uses no critic")
        critic = plan.critic
        parallel = self.layout.critic_parallel
        self.sequence_parallel = new_sequence_parallel_group(
            parallel.world_size, parallel.ulysses_sequence_parallel_size, rank
        )
        self.data_rank = data_parallel_rank(self.sequence_parallel, rank)
        self.forward_options = ForwardOptions(
            remove_padding=critic.use_remove_padding, sequence_parallel=self.sequence_parallel
        )
        spec = ShardingSpec(
            device_type=device_type,
            world_size=parallel.world_size,
            shard_group_size=parallel.fsdp_shard_size,
            mixed_precision=device_type != "cpu",
            # CPUOffloadPolicy either way: see PolicyTrainer.
            param_offload=critic.param_offload or critic.offload_policy,
        )
        # The fresh value head is drawn per rank: the same seed everywhere keeps the shards of one tensor.
        torch.manual_seed(plan.trainer.seed + 1)
        model = load_hf_model(plan.model.path, value_head=True, train_dtype=torch.float32)
        use_packed_attention(model, remove_padding=critic.use_remove_padding, device_type=device_type,
                             sequence_parallel=self.sequence_parallel)
        if critic.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.model = shard_model(model if spec.param_offload else model.to(device), spec, device_mesh(spec))
        self.optimizer_settings = OptimizerSettings(
            lr=critic.lr,
            grad_clip=critic.grad_clip,
            offload_state=critic.optimizer_offload and not critic.offload_policy and device_type != "cpu",
        )
        self.optimizer, self.scheduler = build_optimizer(trainable_parameters(self.model), self.optimizer_settings)

    def compute_values(self, batch: TokenBatch) -> Any:
        import torch

        self.model.eval()
        groups = micro_batch_indices(batch, self.layout.critic_values, self.device)
        with torch.no_grad():
            parts = [value_forward(self.model, batch.select(rows), self.device, self.forward_options) for rows in groups]
        return concat_rows(parts, groups, len(batch))

    def _micro_loss(self, micro: TokenBatch, normalizer: float) -> tuple[Any, dict[str, float]]:
        from rlplan.runtime.algorithms import masked_mean, value_loss

        mask = micro.response_mask.to(self.device)
        values = value_forward(self.model, micro, self.device, self.forward_options)
        loss, stats = value_loss(
            values,
            micro["values"].to(self.device),
            micro["returns"].to(self.device),
            mask,
            self.plan.critic.cliprange_value,
            self.plan.actor.loss_agg_mode,
            normalizer,
            max_response_length=self.plan.data.max_response_length,
        )
        return loss, {
            "vf_loss": float(loss.item()),
            "vf_clip_fraction": float(stats.clip_fraction),
            "values_mean": float(masked_mean(values.detach(), mask)),
        }

    def update(self, batch: TokenBatch, step: int) -> dict[str, float]:
        import torch

        generator = torch.Generator().manual_seed(self.plan.trainer.seed * 7919 + step * 31 + self.data_rank)
        summary = ppo_update(
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            settings=self.optimizer_settings,
            batch=batch,
            role=self.layout.critic_update,
            loss_agg_mode=self.plan.actor.loss_agg_mode,
            world_size=self.layout.critic_parallel.world_size if self.layout.critic_parallel else 1,
            device=self.device,
            shuffle=self.plan.actor.shuffle,
            generator=generator,
            micro_loss=self._micro_loss,
        )
        return summary.metrics("critic", summed=("vf_loss",))
