"""The actor on one rank: old and reference log-probs, and the PPO update.

The reference policy is the actor itself with its LoRA adapter disabled, or for
full fine-tuning a separate frozen copy of the initial weights (sharded the
same way and, where an accelerator exists and the plan asks, offloaded).
"""

from __future__ import annotations

from typing import Any

from rlplan.planner.layout import PlanLayout, plan_layout
from rlplan.planner.plan import Plan
from rlplan.runtime.trainer.forward import ForwardOptions, policy_forward
from rlplan.runtime.trainer.micro_batches import micro_batch_indices
from rlplan.runtime.trainer.model import (
    ShardingSpec,
    apply_lora,
    device_mesh,
    enable_gradient_checkpointing,
    load_hf_model,
    shard_model,
    trainable_parameters,
)
from rlplan.runtime.trainer.optimization import OptimizerSettings, build_optimizer, ppo_update
from rlplan.runtime.trainer.sequence_parallel import (
    data_parallel_rank,
    new_sequence_parallel_group,
    use_ulysses_attention,
)
from rlplan.runtime.trainer.token_batch import TokenBatch


def sharding_spec(plan: Plan, device_type: str, *, param_offload: bool) -> ShardingSpec:
    layout = plan_layout(plan)
    return ShardingSpec(
        device_type=device_type,
        world_size=layout.parallel.world_size,
        shard_group_size=layout.parallel.fsdp_shard_size,
        mixed_precision=device_type != "cpu",
        param_offload=param_offload,
    )


def concat_rows(parts: list[Any], order: list[int], total: int) -> Any:
    """Put per-micro-batch (b, R_i) results back into one (B, max R) tensor in the original order."""
    import torch

    width = max((p.shape[1] for p in parts), default=0)
    out = torch.zeros((total, width), dtype=torch.float32)
    for rows, part in zip(order, parts, strict=True):
        out[torch.as_tensor(rows, dtype=torch.long), : part.shape[1]] = part.detach().float().cpu()
    return out


class PolicyTrainer:
    """The actor (and, for full fine-tuning with a KL term, its reference) on this rank."""

    def __init__(self, plan: Plan, *, device: Any, device_type: str, rank: int) -> None:
        import torch

        self.plan = plan
        self.device = device
        self.rank = rank
        self.layout: PlanLayout = plan_layout(plan)
        parallel = self.layout.parallel
        self.sequence_parallel = new_sequence_parallel_group(
            parallel.world_size, parallel.ulysses_sequence_parallel_size, rank
        )
        self.data_rank = data_parallel_rank(self.sequence_parallel, rank)
        self.forward_options = ForwardOptions(
            remove_padding=plan.model.use_remove_padding,
            temperature=plan.rollout.temperature,
            sequence_parallel=self.sequence_parallel,
        )
        # This runtime's param_offload already shards with FSDP2's CPUOffloadPolicy, which is what verl's
        # offload_policy turns on (the optimizer then steps on the host-resident shards).
        spec = sharding_spec(plan, device_type, param_offload=plan.actor.param_offload or plan.actor.offload_policy)
        self.mesh = device_mesh(spec)
        # Every rank must draw the same fresh LoRA weights before sharding splits them.
        torch.manual_seed(plan.trainer.seed)
        model = load_hf_model(plan.model.path, value_head=False, train_dtype=torch.float32)
        if self.sequence_parallel is not None:
            use_ulysses_attention(model, self.sequence_parallel.size)
        if plan.model.lora.enabled:
            model = apply_lora(model, plan.model.lora, gradient_checkpointing=plan.model.gradient_checkpointing)
        if plan.model.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.model = shard_model(model.to(device) if not spec.param_offload else model, spec, self.mesh)
        self.reference = None
        if plan.uses_reference and not plan.reference_is_actor:
            # As verl: on GPUs the reference always shards with CPU offload (planner.memory.ref_params_on_host).
            reference_spec = sharding_spec(plan, device_type,
                                           param_offload=plan.ref.param_offload or device_type != "cpu")
            reference = load_hf_model(plan.model.path, value_head=False, train_dtype=torch.float32)
            reference.requires_grad_(False)
            if self.sequence_parallel is not None:
                use_ulysses_attention(reference, self.sequence_parallel.size)
            self.reference = shard_model(
                reference if reference_spec.param_offload else reference.to(device), reference_spec, self.mesh
            )
            self.reference.eval()
        self.optimizer_settings = OptimizerSettings(
            lr=plan.actor.lr,
            weight_decay=plan.actor.weight_decay,
            warmup_steps=plan.actor.lr_warmup_steps,
            grad_clip=plan.actor.grad_clip,
            offload_state=plan.actor.optimizer_offload and not plan.actor.offload_policy and device_type != "cpu",
        )
        self.optimizer, self.scheduler = build_optimizer(trainable_parameters(self.model), self.optimizer_settings)

    # --- forward-only passes ------------------------------------------------
    def _score(self, model: Any, batch: TokenBatch, role: Any, *, with_entropy: bool) -> tuple[Any, Any]:
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

    def compute_log_probs(self, batch: TokenBatch) -> tuple[Any, Any]:
        """Old log-probs of the response tokens and their entropy, (B, R) each, on CPU."""
        return self._score(self.model, batch, self.layout.old_log_prob, with_entropy=True)

    def compute_ref_log_probs(self, batch: TokenBatch) -> Any:
        role = self.layout.ref_log_prob or self.layout.old_log_prob
        if self.reference is not None:
            return self._score(self.reference, batch, role, with_entropy=False)[0]
        if not self.plan.model.lora.enabled:
            raise RuntimeError("reference log-probs were asked for, but the plan uses no reference policy")
        with self.model.disable_adapter():
            return self._score(self.model, batch, role, with_entropy=False)[0]

    # --- the update ---------------------------------------------------------
    def _micro_loss(self, micro: TokenBatch, normalizer: float) -> tuple[Any, dict[str, float]]:
        from rlplan.runtime.algorithms import aggregate_loss, kl_penalty, masked_mean, policy_loss

        actor = self.plan.actor
        mask = micro.response_mask.to(self.device)
        want_entropy = actor.entropy_coeff != 0.0
        logp, entropy = policy_forward(self.model, micro, self.device, self.forward_options, with_entropy=want_entropy)
        max_length = self.plan.data.max_response_length
        loss, stats = policy_loss(
            logp,
            micro["old_log_probs"].to(self.device),
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
        if want_entropy:
            entropy_loss = aggregate_loss(entropy, mask, actor.loss_agg_mode, normalizer, max_response_length=max_length)
            loss = loss - actor.entropy_coeff * entropy_loss
        if actor.use_kl_loss:
            kl = kl_penalty(logp, micro["ref_log_probs"].to(self.device), actor.kl_loss_type)
            loss = loss + actor.kl_loss_coef * aggregate_loss(
                kl, mask, actor.loss_agg_mode, normalizer, max_response_length=max_length
            )
            numbers["kl_loss"] = float(masked_mean(kl.detach(), mask))
        return loss, numbers

    def update(self, batch: TokenBatch, step: int) -> dict[str, float]:
        """ppo_epochs x mini batches of optimizer steps on this rank's share of the batch."""
        import torch

        generator = torch.Generator().manual_seed(self.plan.trainer.seed * 1_000_003 + step * 1009 + self.data_rank)
        summary = ppo_update(
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            settings=self.optimizer_settings,
            batch=batch,
            role=self.layout.actor_update,
            loss_agg_mode=self.plan.actor.loss_agg_mode,
            world_size=self.layout.parallel.world_size,
            device=self.device,
            shuffle=self.plan.actor.shuffle,
            generator=generator,
            micro_loss=self._micro_loss,
            activation_offload=self.plan.model.activation_offload,
        )
        return summary.metrics("actor", summed=("pg_loss",))
