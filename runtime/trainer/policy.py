"""The actor on one rank: old and reference log-probs, and the PPO update.

The reference policy is the actor itself with its LoRA adapter disabled, or for
full fine-tuning a separate frozen copy of the initial weights (sharded the
same way and, where an accelerator exists and the plan asks, offloaded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import frozen

from rlplan.planner.layout import PlanLayout, plan_layout
from rlplan.planner.plan import Plan
from rlplan.runtime.trainer.forward import ForwardOptions, policy_forward
from rlplan.runtime.trainer.micro_batches import micro_batch_indices
from rlplan.runtime.trainer.role_model import RoleTrainer, actor_model_spec, build_reference_model
from rlplan.runtime.trainer.token_batch import TokenBatch

if TYPE_CHECKING:

    import torch
    from torch import Tensor, nn

    from rlplan.planner.layout import RoleBatchLayout


def concat_rows(parts: list[Tensor], order: list[list[int]], total: int) -> Tensor:
    """Put per-micro-batch (b, R_i) results back into one (B, max R) tensor in the original order."""
    import torch

    width = max((p.shape[1] for p in parts), default=0)
    out = torch.zeros((total, width), dtype=torch.float32)
    for rows, part in zip(order, parts, strict=True):
        out[torch.as_tensor(rows, dtype=torch.long), : part.shape[1]] = part.detach().float().cpu()
    return out


@frozen(kw_only=True)
class ActorUpdate:
    """What one actor update returns to the controller."""

    metrics: dict[str, float]
    # On-policy updates only: the first forward's per-token log-probs and entropy, (B, R) on CPU in the
    # batch's row order; they stand in for the skipped old-log-prob pass. None otherwise.
    log_probs: Tensor = None
    entropy: Tensor = None


class PolicyTrainer(RoleTrainer):
    """The actor (and, for full fine-tuning with a KL term, its reference) on this rank."""

    def __init__(self, plan: Plan, *, device: torch.device | str, device_type: str, rank: int) -> None:
        self.layout: PlanLayout = plan_layout(plan)
        super().__init__(plan, actor_model_spec(plan, self.layout, device_type), device=device, rank=rank)
        self.forward_options = ForwardOptions(
            remove_padding=plan.model.use_remove_padding,
            temperature=plan.rollout.temperature,
            sequence_parallel=self.sequence_parallel,
        )
        self.reference = None
        if plan.uses_reference and not plan.reference_is_actor:
            self.reference = build_reference_model(
                plan, self.layout, device_type=device_type, device=device, mesh=self.mesh,
                sequence_parallel=self.sequence_parallel,
            )
        # An on-policy update's (sample indices, log-probs, entropy) per micro batch, collected by _micro_loss.
        self._update_scores: list[tuple[list[int], Tensor, Tensor | None]] = []

    # --- forward-only passes ------------------------------------------------
    def _score(self, model: nn.Module, batch: TokenBatch, role: RoleBatchLayout, *, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        import torch

        model.eval()
        groups = micro_batch_indices(batch, role, self.device)
        log_probs, entropies = [], []
        with torch.no_grad():
            for rows in groups:
                micro = batch.select(rows)
                logp, entropy = policy_forward(model, micro, self.device, self.forward_options, with_entropy=with_entropy)
                log_probs.append(logp)
                entropies.append(entropy if entropy is not None else torch.zeros_like(logp))
        return concat_rows(log_probs, groups, len(batch)), concat_rows(entropies, groups, len(batch))

    def compute_log_probs(self, batch: TokenBatch) -> tuple[Tensor, Tensor | None]:
        """Old log-probs of the response tokens and their entropy, (B, R) each, on CPU."""
        return self._score(self.model, batch, self.layout.old_log_prob, with_entropy=True)

    def compute_ref_log_probs(self, batch: TokenBatch) -> Tensor:
        role = self.layout.ref_log_prob or self.layout.old_log_prob
        if self.reference is not None:
            return self._score(self.reference, batch, role, with_entropy=False)[0]
        if not self.plan.model.lora.enabled:
            raise RuntimeError("reference log-probs were asked for, but the plan uses no reference policy")
        with self.model.disable_adapter():
            return self._score(self.model, batch, role, with_entropy=False)[0]

    # --- the update ---------------------------------------------------------
    def _micro_loss(self, micro: TokenBatch, normalizer: float) -> tuple[Tensor, dict[str, float]]:
        from rlplan.runtime.algorithms import aggregate_loss, kl_penalty, masked_mean, policy_loss

        actor = self.plan.actor
        mask = micro.response_mask.to(self.device)
        on_policy = "old_log_probs" not in micro
        # On-policy, the entropy metric the skipped old-log-prob pass would have given comes from here.
        want_entropy = actor.entropy_coeff != 0.0 or on_policy
        logp, entropy = policy_forward(self.model, micro, self.device, self.forward_options, with_entropy=want_entropy)
        if on_policy:
            self._update_scores.append((micro["sample_index"].tolist(), logp.detach(),
                                        entropy.detach() if entropy is not None else None))
        old_logp = logp.detach() if on_policy else micro["old_log_probs"].to(self.device)
        max_length = self.plan.data.max_response_length
        loss, stats = policy_loss(
            logp,
            old_logp,
            micro["advantages"].to(self.device),
            mask,
            actor.clip_ratio_low,
            actor.clip_ratio_high,
            actor.clip_ratio_c,
            actor.loss_agg_mode,
            normalizer,
            max_response_length=max_length,
        )
        numbers = {
            "pg_loss": float(loss.item()),
            "clip_fraction": float(stats.clip_fraction),
            "clip_fraction_lower": float(stats.lower_clip_fraction),
            "ppo_kl": float(stats.approx_kl),
        }
        if actor.entropy_coeff != 0.0:
            entropy_loss = aggregate_loss(entropy, mask, actor.loss_agg_mode, normalizer, max_response_length=max_length)
            loss = loss - actor.entropy_coeff * entropy_loss
        if actor.use_kl_loss:
            kl = kl_penalty(logp, micro["ref_log_probs"].to(self.device), actor.kl_loss_type)
            loss = loss + actor.kl_loss_coef * aggregate_loss(
                kl, mask, actor.loss_agg_mode, normalizer, max_response_length=max_length
            )
            numbers["kl_loss"] = float(masked_mean(kl.detach(), mask))
        return loss, numbers

    def update(self, batch: TokenBatch, step: int) -> ActorUpdate:
        """ppo_epochs x mini batches of optimizer steps on this rank's share of the batch.

        A batch without old_log_probs is updated on-policy: the ratio's denominator is each micro batch's
        own detached log-probs, which equal the old ones only when the update is a single optimizer step.
        """
        import torch

        on_policy = "old_log_probs" not in batch
        if on_policy and not self.layout.actor_update.is_on_policy:
            raise ValueError("a batch without old_log_probs needs an on-policy update (ppo_epochs 1, one mini batch)")
        if on_policy:
            batch = batch.with_fields(sample_index=torch.arange(len(batch)))
        self._update_scores = []
        summary = self._ppo_update(
            batch,
            role=self.layout.actor_update,
            world_size=self.layout.parallel.world_size,
            seed=self.plan.trainer.seed * 1_000_003 + step * 1009 + self.data_rank,
            activation_offload=self.plan.model.activation_offload,
        )
        metrics = summary.metrics("actor", summed=("pg_loss",))
        if not on_policy:
            return ActorUpdate(metrics=metrics)
        order = [rows for rows, _, _ in self._update_scores]
        log_probs = concat_rows([logp for _, logp, _ in self._update_scores], order, len(batch))
        entropy = concat_rows([ent for _, _, ent in self._update_scores], order, len(batch))
        self._update_scores = []
        return ActorUpdate(metrics=metrics, log_probs=log_probs, entropy=entropy)
