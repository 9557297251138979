"""The single controller: one RL iteration, top to bottom, like verl's hybrid engine.

    1 rollout       vLLM samples n responses per prompt, with their sampling log-probs
    2 reward        rule-based scores by data_source (or the plan's `module:function`)
    3 log-probs     old log-probs + entropy (actor), reference log-probs, values (critic)
    4 advantages    GRPO / RLOO / REINFORCE++ on the controller, GAE with the critic's values
    5 update        the actor's PPO update (and the critic's)
    6 weight sync   the LoRA adapter only, or the full weights, into every vLLM engine
    7 metrics       one metrics.jsonl line; a checkpoint every save_freq steps

The sync is checked, not trusted: step 3 of the next iteration scores the tokens
the freshly synced engine sampled, and `sync_logprob_gap` = mean |trainer
log-prob - vLLM log-prob| over them. A sync that never reached the engine shows
up there as a gap that grows with every update.

When the update is on-policy (one optimizer step per step, see
layout.reuses_update_log_probs) step 3 skips the old-log-prob pass: the update's
first forward scores the same weights, its log-probs stand in for the old ones,
and the gap and entropy are taken from them after step 5.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define, frozen

from rlplan.planner.layout import plan_layout, reuses_update_log_probs
from rlplan.planner.phases import ControllerWork, Phase, SyncMode
from rlplan.planner.plan import Plan
from rlplan.planner.platform import Platform
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.runtime import checkpoint
from rlplan.runtime.metrics import (
    MetricsLog,
    PhaseMeasurement,
    open_trackers,
    plan_versus_actual,
    predicted_phase_peaks,
    prediction_bound,
)
from rlplan.runtime.trainer.token_batch import (
    TokenBatch,
    concat_batches,
    response_aligned,
    token_batch_from_sequences,
)

if TYPE_CHECKING:
    # Only for annotations: these modules are imported where they are first used (PromptSource.from_plan,
    # run_loop), so that importing the loop starts neither Ray nor the data readers.
    from rich.console import Console
    from rich.progress import Progress
    from torch import Tensor
    from transformers import PreTrainedTokenizerBase

    from rlplan.runtime.data import PromptDataset, PromptRecord, PromptSampler
    from rlplan.runtime.rewards import RewardFunction
    from rlplan.runtime.rollout.engine import GeneratedSample
    from rlplan.runtime.workers import WorkerGroup

# What one phase returns per worker.
T = TypeVar("T")


@frozen(kw_only=True)
class RunOptions:
    output_dir: Path
    resume: bool = False
    address: str | None = None
    max_steps: int | None = None
    # Test-only negative control: False leaves the rollout engines on their initial weights.
    sync_weights: bool = True
    # What plan-versus-actual prices with (`rlplan run --profile`): on a CPU, the baselines `calibrate --cpu`
    # measured on this machine, else the built-in bounds.
    profile: Profile = DEFAULT_PROFILE


@frozen(kw_only=True)
class RunSummary:
    steps_done: int
    last_step: int
    plan_versus_actual: list[dict[str, Any]]


@define
class PromptSource:
    """The controller's data side: tokenized prompts, the resumable sampler, the reward function."""

    dataset: PromptDataset
    sampler: PromptSampler
    reward: RewardFunction
    tokenizer: PreTrainedTokenizerBase

    @classmethod
    def from_plan(cls, plan: Plan) -> PromptSource:
        """Everything that can be wrong with the data or the reward surfaces here, before any worker starts."""
        from transformers import AutoTokenizer

        from rlplan.runtime.data import PromptSampler, load_prompt_dataset
        from rlplan.runtime.rewards import RewardFunction

        reward = RewardFunction.from_plan(plan.reward)
        tokenizer = AutoTokenizer.from_pretrained(plan.model.path, local_files_only=True)
        dataset = load_prompt_dataset(plan.data.train_files, tokenizer, plan.data)
        reward.check_sources({record.data_source for record in dataset.records})
        return cls(dataset, PromptSampler.for_plan(len(dataset), plan.data), reward, tokenizer)

    @property
    def size(self) -> int:
        return len(self.dataset)

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id or 0)

    def next_batch(self) -> list[PromptRecord]:
        return [self.dataset.records[i] for i in self.sampler.next_batch()]

    def score(self, record: PromptRecord, response_ids: Sequence[int]) -> float:
        text = self.tokenizer.decode(list(response_ids), skip_special_tokens=True)
        return self.reward(record.data_source, text, record.ground_truth, record.extra_info)

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)


def total_steps(plan: Plan, dataset_size: int, max_steps: int | None) -> int:
    """verl's rule: total_training_steps if set, else epochs x batches per epoch; --max-steps caps it."""
    per_epoch = dataset_size // plan.data.train_batch_size
    steps = plan.trainer.total_training_steps or plan.trainer.total_epochs * per_epoch
    return min(steps, max_steps) if max_steps is not None else steps


class Controller:
    """Drives the workers through the steps of a run and records what happened."""

    def __init__(self, plan: Plan, platform: Platform, options: RunOptions, workers: WorkerGroup, data: PromptSource, console: Console | None = None) -> None:
        self.plan = plan
        self.platform = platform
        self.options = options
        self.workers = workers
        self.data = data
        self.console = console
        self.layout = plan_layout(plan)
        self.on_policy = reuses_update_log_probs(plan)
        self.peaks: dict[str, int] = {}
        self.memory_measure = ""
        self.engines_asleep = False
        # Plan versus actual: the planner's per-phase prediction travels with every step's measurement.
        self.predicted_gib = predicted_phase_peaks(plan, options.profile)

    # --- fan-out helpers --------------------------------------------------------------------------
    def _on_trainers(self, method: str, shards: list[TokenBatch] | None, *args: Any) -> list[Any]:
        import ray

        trainers = self.workers.trainers
        # The sp ranks of one Ulysses group share their dp shard: rank // sp is its index.
        sp = self.layout.parallel.ulysses_sequence_parallel_size
        calls = [
            getattr(t, method).remote(*(([shards[rank // sp].to_cpu()] if shards is not None else []) + list(args)))
            for rank, t in enumerate(trainers)
        ]
        return ray.get(calls)

    def _per_shard(self, values: list[Any]) -> list[Any]:
        """One result per dp shard: every rank of a Ulysses group returns the same numbers."""
        return values[:: self.layout.parallel.ulysses_sequence_parallel_size]

    def _phase(self, name: str, results: list[tuple[T, PhaseMeasurement]], record: dict[str, Any]) -> list[T]:
        """Record a phase's wall time (slowest worker) and peak memory (largest worker), return the values."""
        values = [value for value, _ in results]
        measurements = [m for _, m in results]
        record[f"time/{name}"] = max(m.seconds for m in measurements)
        peak = max(m.peak_bytes for m in measurements)
        record[f"memory/{name}_peak_gib"] = peak / 2**30
        self.peaks[name] = max(self.peaks.get(name, 0), peak)
        self.memory_measure = measurements[0].measure
        record["memory_measure"] = self.memory_measure
        held = [m.held_bytes for m in measurements if m.held_bytes is not None]
        if held:
            record[f"memory/{name}_held_gib"] = max(held) / 2**30
        largest = max(measurements, key=lambda m: m.peak_bytes)
        if largest.mapped_bytes is not None:
            # What of the CPU peak is file-backed (libraries) rather than heap: the per-machine part of the RSS.
            record[f"memory/{name}_mapped_gib"] = largest.mapped_bytes / 2**30
        return values

    # --- the step -------------------------------------------------------------------------------
    def rollout(self, prompts: Sequence[Sequence[int]], record: dict[str, Any]) -> list[tuple[int, GeneratedSample]]:
        import ray

        engines = self.workers.rollouts
        if self.engines_asleep:
            ray.get([e.wake_up.remote(None) for e in engines])
            self.engines_asleep = False
        chunks = [list(range(i, len(prompts), len(engines))) for i in range(len(engines))]
        calls = [
            engine.generate.remote([prompts[i] for i in chunk], self.plan.rollout.n, self.plan.data.max_response_length)
            for engine, chunk in zip(engines, chunks, strict=True)
            if chunk
        ]
        results = ray.get(calls)
        per_engine = self._phase(Phase.ROLLOUT, results, record)
        samples: list[tuple[int, GeneratedSample]] = []
        for chunk, engine_samples in zip([c for c in chunks if c], per_engine, strict=True):
            for sample in engine_samples:
                samples.append((chunk[sample.prompt_index], sample))
        samples.sort(key=lambda pair: pair[0])
        return samples

    def step(self, step: int) -> dict[str, Any]:
        import torch

        from rlplan.runtime.batching import balanced_rank_partitions

        plan = self.plan
        record: dict[str, Any] = {"step": step}
        step_start = time.perf_counter()

        # 1 rollout
        batch_rows = self.data.next_batch()
        record["prompt_indices"] = [row.index for row in batch_rows]
        samples = self.rollout([row.prompt_ids for row in batch_rows], record)
        self.release_rollout_memory()

        # 2 reward
        reward_start = time.perf_counter()
        scores = torch.tensor(
            [self.data.score(batch_rows[prompt], sample.response_ids) for prompt, sample in samples], dtype=torch.float32
        )
        record[f"time/{ControllerWork.REWARD}"] = time.perf_counter() - reward_start
        batch = token_batch_from_sequences(
            [s.prompt_ids for _, s in samples], [s.response_ids for _, s in samples], self.data.pad_token_id
        )
        mask = batch.response_mask
        batch = batch.with_fields(rollout_log_probs=response_aligned([s.response_logprobs for _, s in samples], mask.shape[1]))
        group_index = torch.tensor([prompt for prompt, _ in samples], dtype=torch.long)

        # 3 old log-probs (+ entropy), reference log-probs, values; each rank takes a token-balanced share
        partitions = balanced_rank_partitions(batch["sequence_lengths"].tolist(), self.layout.parallel.dp)
        order = [index for part in partitions for index in part]
        shards = [batch.select(part) for part in partitions]
        if not self.on_policy:
            outputs = self._phase(Phase.OLD_LOG_PROB, self._on_trainers("compute_log_probs", shards), record)
            batch = _with_old_log_probs(batch, shards, self._per_shard(outputs), order)
        if plan.uses_reference:
            refs = self._phase(Phase.REF_LOG_PROB, self._on_trainers("compute_ref_log_probs", shards), record)
            batch = batch.with_fields(ref_log_probs=_gather(shards, self._per_shard(refs), order, mask.shape[1]))
        if plan.uses_critic:
            values = self._phase(Phase.CRITIC_VALUES, self._on_trainers("compute_values", shards), record)
            batch = batch.with_fields(values=_gather(shards, self._per_shard(values), order, mask.shape[1]))

        # 4 advantages
        advantage_start = time.perf_counter()
        batch = self.with_advantages(batch, scores, group_index, record)
        record[f"time/{ControllerWork.ADVANTAGES}"] = time.perf_counter() - advantage_start

        # 5 actor (and critic) update
        shards = [batch.select(part) for part in partitions]
        if plan.uses_critic:
            critic_metrics = self._phase(Phase.CRITIC_UPDATE, self._on_trainers("update_critic", shards, step), record)
            record.update(_mean_metrics(critic_metrics))
        actor_updates = self._phase(Phase.ACTOR_UPDATE, self._on_trainers("update_actor", shards, step), record)
        record.update(_mean_metrics([update.metrics for update in actor_updates]))
        if self.on_policy:
            own_log_probs = [(update.log_probs, update.entropy) for update in self._per_shard(actor_updates)]
            batch = _with_old_log_probs(batch, shards, own_log_probs, order)
        # The trainer's log-probs of the tokens vLLM sampled, before this step's update changed the weights.
        gap = ((batch["old_log_probs"] - batch["rollout_log_probs"]).abs() * mask).sum() / mask.sum().clamp(min=1)
        record["sync_logprob_gap"] = float(gap)
        if plan.uses_reference:
            record["kl_ref"] = _kl_to_reference(batch, plan.algorithm.kl_penalty, mask)

        # 6 weight sync: the next rollout's gap (step 3) shows whether it arrived
        if self.options.sync_weights:
            record.update(self.sync_weights(SyncMode.ADAPTER if plan.model.lora.enabled else SyncMode.MERGED))

        # 7 metrics
        record.update(_batch_statistics(batch, scores, mask))
        for phase in (Phase.ROLLOUT, Phase.OLD_LOG_PROB, Phase.ACTOR_UPDATE):
            if record.get(f"time/{phase}"):
                tokens = float(mask.sum()) if phase == Phase.ROLLOUT else float(batch["sequence_lengths"].sum())
                record[f"throughput/{phase}_tokens_per_s"] = tokens / record[f"time/{phase}"]
        record.update({f"memory/{phase}_predicted_gib": gib for phase, gib in self.predicted_gib.items()})
        record["time/step"] = time.perf_counter() - step_start
        return record

    def with_advantages(self, batch: TokenBatch, scores: Tensor, group_index: Tensor, record: dict[str, Any]) -> TokenBatch:
        from rlplan.runtime import algorithms

        plan = self.plan
        mask = batch.response_mask
        estimator = plan.algorithm.adv_estimator
        if estimator == "grpo":
            advantages = algorithms.grpo_advantages(
                scores,
                group_index,
                mask,
                norm_by_std=plan.algorithm.norm_adv_by_std_in_grpo,
                leave_one_out=plan.algorithm.grpo_leave_one_out,
            )
            return batch.with_fields(advantages=advantages)
        if estimator == "rloo":
            return batch.with_fields(advantages=algorithms.rloo_advantages(scores, group_index, mask))
        in_reward = None
        if plan.algorithm.use_kl_in_reward:
            in_reward = algorithms.kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], plan.algorithm.kl_penalty) * mask
        token_rewards = algorithms.token_level_rewards(scores, mask, in_reward, plan.algorithm.kl_coef)
        if estimator == "reinforce_plus_plus":
            advantages = algorithms.reinforce_plus_plus_advantages(token_rewards, mask, plan.algorithm.gamma)
            return batch.with_fields(advantages=advantages)
        advantages, returns = algorithms.gae_advantages(
            token_rewards, batch["values"], mask, plan.algorithm.gamma, plan.algorithm.lam
        )
        return batch.with_fields(advantages=advantages, returns=returns)

    def sync_weights(self, what: SyncMode) -> dict[str, Any]:
        """Trainer -> every engine. With sleep mode: wake the weights, load, then the KV cache."""
        import ray

        record: dict[str, Any] = {}

        engines = self.workers.rollouts
        sleeps = self.platform.supports_sleep_mode and self.plan.rollout.free_cache_engine
        start = time.perf_counter()
        if sleeps:
            ray.get([e.wake_up.remote(["weights"]) for e in engines])
        timings = self._phase(
            Phase.WEIGHT_SYNC, ray.get([t.push_weights.remote(engines, what) for t in self.workers.trainers]), record
        )
        if sleeps:
            ray.get([e.wake_up.remote(["kv_cache"]) for e in engines])
            self.engines_asleep = False
        record["time/weight_sync"] = time.perf_counter() - start
        record["time/weight_gather"] = max(t["gather_seconds"] for t in timings)
        record["time/weight_load"] = max(t["load_seconds"] for t in timings)
        return record

    def initial_sync(self) -> None:
        """Engines started from dummy weights get the base (or full) weights once before the first rollout."""
        if self.plan.rollout.load_format == "dummy":
            self.sync_weights(SyncMode.BASE if self.plan.model.lora.enabled else SyncMode.MERGED)

    def release_rollout_memory(self) -> None:
        """Sleep the engines so the trainer gets the GPU memory back (woken again by the next sync)."""
        import ray

        if self.platform.supports_sleep_mode and self.plan.rollout.free_cache_engine:
            ray.get([e.sleep.remote() for e in self.workers.rollouts])
            self.engines_asleep = True

    def save(self, step: int) -> Path:
        import ray

        staging = checkpoint.begin_checkpoint(self.options.output_dir, step)
        ray.get([t.save_checkpoint.remote(str(staging)) for t in self.workers.trainers])
        return checkpoint.commit_checkpoint(
            self.options.output_dir,
            step,
            {"data": self.data.state_dict()},
            keep=self.plan.trainer.max_checkpoints_to_keep,
        )

    def restore(self, directory: Path) -> int:
        import ray

        ray.get([t.load_checkpoint.remote(str(directory)) for t in self.workers.trainers])
        state = checkpoint.read_trainer_state(directory)
        self.data.load_state_dict(state["data"])
        return int(state["step"])

    def plan_versus_actual(self) -> list[dict[str, Any]]:
        return plan_versus_actual(self.predicted_gib, self.peaks, self.memory_measure,
                                  bound=prediction_bound(self.options.profile))


def _fields(shard: TokenBatch, **fields: Tensor) -> TokenBatch:
    return TokenBatch({"input_ids": shard["input_ids"], "prompt_lengths": shard["prompt_lengths"], "sequence_lengths": shard["sequence_lengths"], **fields})


def _with_old_log_probs(batch: TokenBatch, shards: list[TokenBatch], scores: list[tuple[Tensor, Tensor]], order: list[int]) -> TokenBatch:
    """The batch with the trainer's per-shard (log-probs, entropy) as old_log_probs and entropy, in batch order."""
    width = batch.response_mask.shape[1]
    old = concat_batches([_fields(shard, old_log_probs=lp, entropy=ent) for shard, (lp, ent) in zip(shards, scores, strict=True)], order)
    return batch.with_fields(old_log_probs=old["old_log_probs"][:, :width], entropy=old["entropy"][:, :width])


def _kl_to_reference(batch: TokenBatch, kind: str, mask: Tensor) -> float:
    from rlplan.runtime import algorithms

    kl = algorithms.kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], kind) * mask
    return float(algorithms.masked_mean(kl, mask))


def _gather(shards: list[TokenBatch], values: list[Tensor], order: list[int], width: int) -> Tensor:
    merged = concat_batches([_fields(shard, value=v) for shard, v in zip(shards, values, strict=True)], order)
    out = merged["value"][:, :width]
    if out.shape[1] < width:
        import torch

        out = torch.nn.functional.pad(out, (0, width - out.shape[1]))
    return out


def _mean_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    keys = per_rank[0].keys()
    return {key: sum(m[key] for m in per_rank) / len(per_rank) for key in keys}


def _batch_statistics(batch: TokenBatch, scores: Tensor, mask: Tensor) -> dict[str, float]:
    from rlplan.runtime.algorithms import masked_mean

    lengths = batch.response_lengths.float()
    # The lengths the data really had: `calibrate --from-run` carries their means into a profile.
    prompts = batch["prompt_lengths"].float()
    return {
        "reward_mean": float(scores.mean()),
        "reward_max": float(scores.max()),
        "reward_min": float(scores.min()),
        "entropy": float(masked_mean(batch["entropy"], mask)),
        "prompt_length_mean": float(prompts.mean()),
        "prompt_length_max": float(prompts.max()),
        "response_length_mean": float(lengths.mean()),
        "response_length_max": float(lengths.max()),
        "response_length_min": float(lengths.min()),
        "advantages_abs_mean": float(masked_mean(batch["advantages"].abs(), mask)),
        "sequences": float(len(batch)),
    }


def run_loop(
    plan: Plan, platform: Platform, options: RunOptions, data: PromptSource, console: Console | None = None, progress: Progress | None = None
) -> RunSummary:
    """Start the workers, optionally restore, run the steps, checkpoint, shut down."""
    import ray

    from rlplan.runtime.progress import RunProgress
    from rlplan.runtime.workers import create_workers, start_ray

    screen = RunProgress(progress)
    screen.stage("starting Ray")
    started = start_ray(options.address, platform, plan.cluster.world_size)
    workers = None
    log = None
    try:
        workers = create_workers(plan, platform, on_stage=screen.stage)
        controller = Controller(plan, platform, options, workers, data, console)
        first_step = 1
        if options.resume:
            latest = checkpoint.latest_complete_checkpoint(options.output_dir)
            if latest is not None:
                screen.stage(f"restoring {latest}")
                first_step = controller.restore(latest) + 1
                if console is not None:
                    console.print(f"resumed from {latest} (continuing at step {first_step})")
        last_step = total_steps(plan, data.size, options.max_steps)
        resumed = options.resume and first_step > 1
        log = MetricsLog(options.output_dir, resume=resumed,
                         trackers=open_trackers(plan, options.output_dir, console, resume=resumed))
        screen.stage("sending the weights to the rollout engine")
        controller.initial_sync()
        if first_step > 1:
            # The engines loaded the initial weights; the restored policy must reach them before step one.
            controller.sync_weights(SyncMode.ADAPTER if plan.model.lora.enabled else SyncMode.MERGED)
        screen.start_steps(first_step, last_step)
        done = 0
        for step in range(first_step, last_step + 1):
            record = controller.step(step)
            log.write(record)
            done += 1
            save_freq = plan.trainer.save_freq
            if save_freq > 0 and (step % save_freq == 0 or step == last_step):
                controller.save(step)
            screen.step_done(step, record)
        return RunSummary(steps_done=done, last_step=last_step, plan_versus_actual=controller.plan_versus_actual())
    finally:
        if log is not None:
            log.close()
        if workers is not None:
            workers.shutdown()
        if started:
            ray.shutdown()
