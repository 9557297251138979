"""The PPO critic on one rank: the actor's backbone with a one-output token head.

Like verl, the critic starts from the actor's weights (model.path) with a fresh
value head, and is trained in full (no LoRA) with its own optimizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlplan.planner.layout import PlanLayout, RoleBatchLayout, plan_layout
from rlplan.planner.plan import Plan
from rlplan.runtime.trainer.forward import ForwardOptions, value_forward
from rlplan.runtime.trainer.micro_batches import micro_batch_indices
from rlplan.runtime.trainer.policy import concat_rows
from rlplan.runtime.trainer.role_model import RoleTrainer, critic_model_spec
from rlplan.runtime.trainer.token_batch import TokenBatch

if TYPE_CHECKING:
    import torch
    from torch import Tensor


class CriticTrainer(RoleTrainer):
    def __init__(self, plan: Plan, *, device: torch.device | str, device_type: str, rank: int) -> None:
        self.layout: PlanLayout = plan_layout(plan)
        if self.layout.critic_update is None or self.layout.critic_values is None or self.layout.critic_parallel is None:
            raise ValueError("the plan uses no critic")
        self.values_role: RoleBatchLayout = self.layout.critic_values
        super().__init__(plan, critic_model_spec(plan, self.layout, device_type), device=device, rank=rank)
        self.forward_options = ForwardOptions(
            remove_padding=plan.critic.use_remove_padding, sequence_parallel=self.sequence_parallel
        )

    def compute_values(self, batch: TokenBatch) -> Tensor:
        import torch

        self.model.eval()
        groups = micro_batch_indices(batch, self.values_role, self.device)
        with torch.no_grad():
            parts = [value_forward(self.model, batch.select(rows), self.device, self.forward_options) for rows in groups]
        return concat_rows(parts, groups, len(batch))

    def _micro_loss(self, micro: TokenBatch, normalizer: float) -> tuple[Tensor, dict[str, float]]:
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
        role = self.layout.critic_update
        if role is None:
            raise ValueError("the plan trains no critic")
        summary = self._ppo_update(
            batch,
            role=role,
            world_size=self.layout.critic_parallel.world_size if self.layout.critic_parallel else 1,
            seed=self.plan.trainer.seed * 7919 + step * 31 + self.data_rank,
        )
        return summary.metrics("critic", summed=("vf_loss",))
