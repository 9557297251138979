"""One verl step's wall time, per phase, at the workload's real lengths: what the solver ranks plans by.

Not a simulator, but each phase is priced the way verl runs it (docs/steptime.md has the model, its
constants and how far it is from published runs):

* Lengths.  Every phase runs at the data's mean lengths (`data.expected_*_length`, else the lengths a
  calibrated profile observed, else `profile.unstated_length_fraction` of the maxima), and responses
  follow a log-normal of that mean and `profile.response_length_sigma`, cut at max_response_length.
* Rollout.  Each engine decodes its share of the generation batch (`data.gen_batch_size` prompts where a
  DAPO-style recipe sets it) at the concurrency its KV cache holds at those lengths.  A decode step costs
  the longer of the GPU's roofline (weights + every running sequence's KV from HBM, TP all-reduces) and
  the engine's host work (a floor per layer, lower with CUDA graphs than eager, and a cost per running
  sequence: scheduling, sampling, detokenizing).  The batch ends with its longest responses: once the
  queue is empty the running sequences drain along the length distribution at ever smaller batches.
* Trainer passes.  Tokens really processed (mean lengths with remove padding, the maximum without) at the
  GPU's peak FLOP/s x the MFU its class reaches, plus a fixed cost per micro batch and layer; FSDP's
  collectives bound each micro batch.  The old-log-prob pass also computes the entropy over the
  vocabulary; the reference pass does not (with LoRA it is the actor with its adapter disabled).
* Offload, weight sync and sleep/wake: PCIe and collective traffic as before.

The public entry point is `predict_step_time(plan, memory, profile, layout) -> StepTime`, per-phase
seconds keyed by `Phase` names plus "offload".
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import attrs
from attrs import frozen

from rlplan.planner.layout import PlanLayout, RoleBatchLayout, plan_layout, reuses_update_log_probs
from rlplan.planner.memory import MemoryReport
from rlplan.planner.memory.fsdp import (
    TrainerState,
    actor_state,
    critic_state,
    offloaded_by_policy,
    ref_param_bytes,
    ref_params_on_host,
)
from rlplan.planner.memory.model_facts import ModelFacts, lora_params, model_facts
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile

GB = 1e9
_NORMAL = NormalDist()
# Points of the drain integral (the batch's last sequences finishing): enough for 1 % on smooth tails.
_DRAIN_POINTS = 48


@frozen
class StepTime:
    phase_seconds: dict[str, float] = attrs.field(factory=dict)

    @property
    def total_seconds(self) -> float:
        return sum(self.phase_seconds.values())


# --- the workload's lengths ----------------------------------------------------------------------


@frozen(kw_only=True)
class Lengths:
    """Mean prompt and response tokens, and the response length distribution a batch draws from.

    Responses are log-normal of shape `sigma`, cut at `response_max` (verl stops a response there), with
    `log_median` chosen so that the cut distribution's mean is `response_mean`, the mean a run reports;
    sigma 0 is every response at its mean (ignore_eos: the maximum).
    """

    prompt_mean: float
    response_mean: float
    response_max: int
    sigma: float
    log_median: float = attrs.field()

    @log_median.default
    def _log_median_for_the_mean(self) -> float:
        if self.sigma <= 0.0 or self.response_mean >= self.response_max:
            return math.log(max(self.response_mean, 1.0))
        return _log_median_of_capped_mean(self.response_mean, self.response_max, self.sigma)

    @property
    def sequence_mean(self) -> float:
        return self.prompt_mean + self.response_mean

    def survival(self, tokens: float) -> float:
        """P(a response is longer than `tokens`)."""
        if tokens >= self.response_max:
            return 0.0
        if self.sigma <= 0.0:
            return 1.0 if tokens < self.response_mean else 0.0
        if tokens <= 0:
            return 1.0
        return 1.0 - _NORMAL.cdf((math.log(tokens) - self.log_median) / self.sigma)

    def longest_of(self, count: float) -> float:
        """The expected longest response of `count` (its 1 - 1/(count + 1) quantile), at most the maximum."""
        if self.sigma <= 0.0 or count <= 1:
            return min(float(self.response_max), self.response_mean)
        z = _NORMAL.inv_cdf(1.0 - 1.0 / (count + 1.0))
        return min(float(self.response_max), math.exp(self.log_median + self.sigma * z))

    @property
    def running_response(self) -> float:
        """Mean tokens generated so far by a running sequence: long responses run longer, so the mean in
        flight is E[L^2] / 2E[L] = mean x exp(sigma^2) / 2 for a log-normal, at most half the maximum."""
        return min(self.response_mean * math.exp(self.sigma**2) / 2, self.response_max / 2)


def _capped_mean(log_median: float, cap: float, sigma: float) -> float:
    """E[min(L, cap)] of a log-normal L with median exp(log_median) and shape sigma."""
    log_cap = math.log(cap)
    below = math.exp(log_median + sigma**2 / 2) * _NORMAL.cdf((log_cap - log_median - sigma**2) / sigma)
    return below + cap * (1.0 - _NORMAL.cdf((log_cap - log_median) / sigma))


@functools.lru_cache(maxsize=256)
def _log_median_of_capped_mean(mean: float, cap: float, sigma: float) -> float:
    """The log-median whose log-normal, cut at `cap`, has mean `mean` (< cap), by bisection: the mean rises
    with the median."""
    low, high = math.log(mean) - sigma**2 / 2 - 1.0, math.log(cap) + 4 * sigma
    for _ in range(40):
        middle = (low + high) / 2
        if _capped_mean(middle, cap, sigma) < mean:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _mean_length(expected: int | None, observed: int, maximum: int, fraction: float) -> float:
    if expected is not None:
        return float(min(expected, maximum))
    if observed > 0:
        return float(min(observed, maximum))
    return max(1.0, fraction * maximum)


def workload_lengths(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> Lengths:
    """The plan's lengths: stated means, else the profile's observed ones, else a fraction of the maxima."""
    data = plan.data
    prompt = _mean_length(data.expected_prompt_length, profile.observed_prompt_length, data.max_prompt_length,
                          profile.unstated_length_fraction)
    if plan.rollout.ignore_eos:
        return Lengths(prompt_mean=prompt, response_mean=float(data.max_response_length),
                       response_max=data.max_response_length, sigma=0.0)
    response = _mean_length(data.expected_response_length, profile.observed_response_length,
                            data.max_response_length, profile.unstated_length_fraction)
    return Lengths(prompt_mean=prompt, response_mean=response, response_max=data.max_response_length,
                   sigma=profile.response_length_sigma)


# --- rates -----------------------------------------------------------------------------------------


def training_mfu_key(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> str:
    """The profile key of the MFU a trainer pass reaches on the plan's GPU class.

    FLOP-dense GPUs (H100, H200, B200, MI300X: at least `training_mfu_dense_gpu_tflops` bf16 TFLOP/s) stay
    further from their peak than GPUs with few FLOPs per byte of HBM (H20, A100, L40S): the same kernels,
    launches and collectives cost a larger share of a faster GPU's time.  A CPU plan keeps training_mfu,
    which `calibrate --cpu` fits.
    """
    gpu = plan.cluster.gpu
    if gpu.is_cpu or gpu.bf16_tflops >= profile.training_mfu_dense_gpu_tflops:
        return "training_mfu"
    return "training_mfu_light_gpu"


class _Rates:
    """Achieved rates of one cluster under a profile, in FLOP/s and bytes/s."""

    __slots__ = ("gpu", "training_mfu", "prefill_flops", "decode_flops", "hbm", "pcie", "intranode",
                 "internode",
                 "gpus_per_node")

    def __init__(self, plan: Plan, profile: Profile) -> None:
        gpu = plan.cluster.gpu
        self.gpu = gpu
        self.training_mfu = float(getattr(profile, training_mfu_key(plan, profile)))
        # The engine computes in its own dtype (rollout.dtype): on a CPU bf16 and fp32 rates differ by ~2x either way.
        self.prefill_flops = gpu.tflops(plan.rollout.dtype) * 1e12 * profile.prefill_mfu
        self.decode_flops = gpu.tflops(plan.rollout.dtype) * 1e12 * profile.decode_mfu
        self.hbm = gpu.hbm_gbps * GB * profile.decode_hbm_efficiency
        self.pcie = gpu.pcie_gbps * GB * profile.pcie_efficiency
        self.intranode = gpu.intranode_gbps * GB * profile.collective_efficiency
        self.internode = min(gpu.intranode_gbps, plan.cluster.internode_gbps) * GB * profile.collective_efficiency
        self.gpus_per_node = plan.cluster.gpus_per_node

    def train_flops(self, compute_dtype: str) -> float:
        """Achieved FLOP/s of a trainer pass computing in `compute_dtype` (the role's compute_dtype)."""
        return self.gpu.tflops(compute_dtype) * 1e12 * self.training_mfu

    def collective(self, group_size: int) -> float:
        """Bandwidth of a collective over `group_size` ranks: NVLink-class inside a node, the NIC across."""
        return self.intranode if group_size <= self.gpus_per_node else self.internode


def ring_seconds(total_bytes: float, group_size: int, bandwidth: float) -> float:
    """A ring all-gather or reduce-scatter of `total_bytes` (the unsharded size) over `group_size` ranks."""
    if group_size <= 1:
        return 0.0
    return total_bytes * (group_size - 1) / group_size / bandwidth


def fsdp_pass_seconds(compute_seconds: float, micro_batches: int, collective_seconds_per_micro: float) -> float:
    """Micro batches whose collectives overlap compute: each takes the longer of the two."""
    if micro_batches <= 0:
        return compute_seconds
    return micro_batches * max(compute_seconds / micro_batches, collective_seconds_per_micro)


# --- trainer passes ------------------------------------------------------------------------------------


def _pass_sequence_length(plan: Plan, lengths: Lengths) -> float:
    """Tokens per sequence a trainer pass computes: the mean with remove padding, the padded maximum
    without."""
    if plan.model.use_remove_padding:
        return lengths.sequence_mean
    return float(plan.data.max_sequence_length)


def _tokens_per_gpu(plan: Plan, role: RoleBatchLayout, lengths: Lengths) -> float:
    return role.sequences_per_gpu * _pass_sequence_length(plan, lengths) / role.sequence_parallel_size


def _micro_batches(plan: Plan, role: RoleBatchLayout, lengths: Lengths) -> int:
    """Micro batches one GPU runs in the pass: dynamic batches pack the chunk's real tokens into the
    budget."""
    if role.max_token_len_per_gpu is None:
        return role.micro_batches_per_step
    chunk_tokens = role.chunk_size * _pass_sequence_length(plan, lengths)
    per_chunk = max(1, math.ceil(chunk_tokens / (role.max_token_len_per_gpu * role.sequence_parallel_size)))
    return role.mini_batches_per_epoch * per_chunk * role.epochs


def _training_flops_per_token(plan: Plan, facts: ModelFacts, lengths: Lengths, critic: bool) -> float:
    """Forward FLOPs per token at the mean causal context of a packed sequence (half its length)."""
    flops = facts.forward_flops_per_token(_pass_sequence_length(plan, lengths) / 2)
    if critic:
        # A value head replaces the vocabulary projection.
        flops -= 2.0 * facts.vocab * facts.hidden
    return flops


def _compute_dtype(plan: Plan, critic: bool) -> str:
    # The reference pass is priced at the actor's dtype: with the default YAML both are bfloat16.
    return plan.critic.compute_dtype if critic else plan.actor.compute_dtype


def _policy_state(plan: Plan, shard: int, critic: bool) -> TrainerState:
    return critic_state(plan, shard) if critic else actor_state(plan, shard)


def _fixed_micro_batch_seconds(facts: ModelFacts, micro_batches: int, profile: Profile,
                               passes: float) -> float:
    """Python, kernel launches and FSDP hooks per micro batch and layer; `passes`: 1 forward, 3 with
    backward."""
    return micro_batches * facts.layers * profile.micro_batch_seconds_per_layer * passes


def _entropy_seconds(facts: ModelFacts, tokens: float, rates: _Rates, profile: Profile) -> float:
    """verl's old-log-prob pass also computes the entropy: memory-bound passes over fp32 logits."""
    return tokens * facts.vocab * profile.entropy_bytes_per_token_vocab / rates.hbm


def _forward_pass(plan: Plan, role: RoleBatchLayout, rates: _Rates, shard: int, profile: Profile,
                  lengths: Lengths, *, critic: bool, entropy: bool) -> float:
    facts = model_facts(plan.model.arch)
    tokens = _tokens_per_gpu(plan, role, lengths)
    micro_batches = _micro_batches(plan, role, lengths)
    compute = (tokens * _training_flops_per_token(plan, facts, lengths, critic)
               / rates.train_flops(_compute_dtype(plan, critic)))
    if entropy:
        compute += _entropy_seconds(facts, tokens, rates, profile)
    params = facts.critic_params if critic else facts.params
    gather = ring_seconds(2.0 * params, shard, rates.collective(shard))
    if offloaded_by_policy(plan, "critic" if critic else "actor"):
        # CPUOffloadPolicy copies each layer's host shard to the GPU before its all-gather.
        gather += _policy_state(plan, shard, critic).params / rates.pcie
    return (fsdp_pass_seconds(compute, micro_batches, gather)
            + _fixed_micro_batch_seconds(facts, micro_batches, profile, passes=1.0))


def _update_pass(plan: Plan, role: RoleBatchLayout, rates: _Rates, shard: int, profile: Profile,
                 lengths: Lengths, *, critic: bool) -> float:
    facts = model_facts(plan.model.arch)
    n_lora = 0 if critic else lora_params(plan)
    checkpointing = plan.critic.gradient_checkpointing if critic else plan.model.gradient_checkpointing
    # Backward costs 2x forward, 1x with a frozen base (activation grads only); recompute adds 1x.
    multiplier = (2.0 if n_lora else 3.0) + (1.0 if checkpointing else 0.0)
    tokens = _tokens_per_gpu(plan, role, lengths) * role.epochs
    micro_batches = _micro_batches(plan, role, lengths)
    compute = (tokens * _training_flops_per_token(plan, facts, lengths, critic) * multiplier
               / rates.train_flops(_compute_dtype(plan, critic)))
    if not critic and plan.actor.entropy_coeff != 0:
        # The entropy's forward and backward over the logits.
        compute += 2.0 * _entropy_seconds(facts, tokens, rates, profile)
    params = facts.critic_params if critic else facts.params
    trainable = n_lora or params
    bandwidth = rates.collective(shard)
    # bf16 all-gather in forward and again in backward (reshard after forward), fp32 reduce-scatter.
    collectives = 2 * ring_seconds(2.0 * params, shard, bandwidth) + ring_seconds(4.0 * trainable, shard, bandwidth)
    policy = offloaded_by_policy(plan, "critic" if critic else "actor")
    if policy:
        # CPUOffloadPolicy: the host shards cross PCIe into the forward and the backward all-gathers of
        # every micro batch, and each reduced gradient shard goes back to the host to accumulate there.
        state = _policy_state(plan, shard, critic)
        collectives += (2.0 * state.params + state.grads) / rates.pcie
    seconds = fsdp_pass_seconds(compute, micro_batches, collectives)
    seconds += _fixed_micro_batch_seconds(facts, micro_batches, profile, passes=multiplier)
    if policy:
        # The optimizer steps on the CPU, whose AdamW rate the node's ranks share.
        seconds += (role.optimizer_steps_per_step * trainable / shard * rates.gpus_per_node
                    / profile.cpu_adam_params_per_s)
    else:
        # AdamW reads params, grads and both moments and writes three of them back, all fp32.
        seconds += role.optimizer_steps_per_step * 28.0 * trainable / shard / rates.hbm
    if not critic and plan.model.activation_offload:
        offloaded_layers = max(0, facts.layers - profile.activation_offload_resident_layers)
        per_token = 2 * facts.hidden if checkpointing else facts.layer_activation_bytes_per_token
        # Every token's saved activations go to the host in forward and come back in backward.
        seconds += 2.0 * offloaded_layers * per_token * tokens / rates.pcie
    return seconds


# --- the rollout -------------------------------------------------------------------------------------


@frozen(kw_only=True)
class DecodeStep:
    """What one decode step of one engine costs, as a function of its running sequences and their context."""

    weight_bytes: float
    kv_bytes_per_token: float
    hbm: float
    # Per TP rank: matmul FLOPs per generated token, and attention FLOPs per token of its context.
    matmul_flops_per_token: float
    attention_flops_per_context_token: float
    achieved_flops: float
    tp_seconds_fixed: float
    tp_seconds_per_sequence: float
    host_floor: float
    host_per_sequence: float

    def seconds(self, running: float, context: float) -> float:
        if running <= 0:
            return 0.0
        memory = (self.weight_bytes + running * context * self.kv_bytes_per_token) / self.hbm
        per_token = self.matmul_flops_per_token + self.attention_flops_per_context_token * context
        compute = running * per_token / self.achieved_flops
        gpu = max(memory, compute) + self.tp_seconds_fixed + running * self.tp_seconds_per_sequence
        host = self.host_floor + running * self.host_per_sequence
        # The engine's host work and the GPU's kernels overlap; the slower one sets the pace.
        return max(gpu, host)


def decode_step(plan: Plan, rates: _Rates, profile: Profile, hbm: float, flops: float,
                concurrency: float) -> DecodeStep:
    """The decode step of one engine of the plan: GPU roofline per TP rank and the engine's host costs."""
    arch = plan.model.arch
    facts = model_facts(arch)
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    weight_params = float(facts.params)
    if facts.routed_expert_params:
        # Experts no sequence in the batch routed to are not read.
        untouched = (1.0 - arch.num_experts_per_token / arch.num_experts) ** max(1.0, concurrency)
        weight_params -= facts.routed_expert_params * untouched
    eager = rollout.enforce_eager or plan.cluster.gpu.is_cpu
    tp_fixed = tp_per_sequence = 0.0
    if t > 1:
        # Two all-reduces of the running batch's hidden states per layer, each launched from Python when eager.
        bandwidth = rates.collective(t)
        latency_us = profile.tp_allreduce_latency_us if eager else profile.tp_allreduce_graph_latency_us
        tp_fixed = 2 * facts.layers * latency_us * 1e-6
        hidden_bytes = 2.0 * facts.hidden * rollout.dtype_bytes
        tp_per_sequence = 2 * facts.layers * hidden_bytes * (t - 1) / t / bandwidth
    per_layer = profile.decode_eager_seconds_per_layer if eager else profile.decode_graph_seconds_per_layer
    return DecodeStep(
        weight_bytes=rollout.dtype_bytes * weight_params / t,
        kv_bytes_per_token=arch.kv_cache_bytes_per_token(t, rollout.dtype_bytes),
        hbm=hbm,
        matmul_flops_per_token=facts.matmul_flops_per_token / t,
        attention_flops_per_context_token=facts.attention_flops_per_context_token / t,
        achieved_flops=flops,
        tp_seconds_fixed=tp_fixed,
        tp_seconds_per_sequence=tp_per_sequence,
        host_floor=profile.decode_step_floor_s + per_layer * facts.layers,
        host_per_sequence=profile.decode_seconds_per_sequence,
    )


def _drain_seconds(step: DecodeStep, lengths: Lengths, running: float, longest: float,
                   kv_tokens: float) -> float:
    """`running` sequences started together, each ending at its own length: the step shrinks as they finish.

    Integrates the step time over decode positions 0..longest, with the survivors' count and context.
    Where the survivors' KV outgrows the cache, vLLM runs only what it holds and preempts the rest, which
    wait and recompute: that stretch takes survivors / held steps per position.
    """
    if running <= 0 or longest <= 0:
        return 0.0
    seconds = 0.0
    previous = 0.0
    for i in range(1, _DRAIN_POINTS + 1):
        # Denser near the start, where the batch is largest and shrinks fastest.
        position = longest * (i / _DRAIN_POINTS) ** 2
        middle = (previous + position) / 2
        context = lengths.prompt_mean + middle
        survivors = max(running * lengths.survival(middle), 1.0)
        held = max(1.0, min(survivors, kv_tokens / context))
        seconds += (position - previous) * survivors / held * step.seconds(held, context)
        previous = position
    return seconds


def rollout_concurrency(plan: Plan, memory: MemoryReport, lengths: Lengths, sequences: float) -> float:
    """Sequences one engine runs at once: max_num_seqs, the batch, or what its KV cache holds at the
    lengths."""
    in_flight = lengths.prompt_mean + lengths.running_response
    kv_held = memory.rollout.usable_kv_cache_tokens / max(1.0, in_flight)
    return max(1.0, min(float(plan.rollout.max_num_seqs), kv_held, math.ceil(sequences)))


def rollout_seconds(plan: Plan, memory: MemoryReport, rates: _Rates, profile: Profile, layout: PlanLayout,
                    lengths: Lengths | None = None) -> float:
    """Prefill at FLOPs, a full-concurrency phase while the queue lasts, then the drain to the longest
    response."""
    lengths = lengths or workload_lengths(plan, profile)
    facts = model_facts(plan.model.arch)
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    replicas = max(1, layout.parallel.rollout_replicas)
    prefill_flops, decode_flops, hbm = rates.prefill_flops, rates.decode_flops, rates.hbm
    if layout.parallel.one_rollout_engine:
        # The one engine generates while the trainer ranks wait: every rank's share of cores and bandwidth.
        share = rates.gpus_per_node
        prefill_flops, decode_flops, hbm = prefill_flops * share, decode_flops * share, hbm * share
    prompts_per_step = plan.data.gen_batch_size or plan.data.train_batch_size
    sequences = prompts_per_step * rollout.n / replicas
    prompts = prompts_per_step / replicas if rollout.enable_prefix_caching else sequences
    prefill = (prompts * lengths.prompt_mean * facts.forward_flops_per_token(lengths.prompt_mean / 2)
               / (t * prefill_flops))

    concurrency = rollout_concurrency(plan, memory, lengths, sequences)
    step = decode_step(plan, rates, profile, hbm, decode_flops, concurrency)
    queued = max(0.0, sequences - concurrency)
    # While sequences wait, the engine runs full: each finishing sequence is replaced at once.
    full = queued * lengths.response_mean / concurrency * step.seconds(
        concurrency, lengths.prompt_mean + lengths.running_response)
    drain = _drain_seconds(step, lengths, min(concurrency, sequences), lengths.longest_of(sequences),
                           float(memory.rollout.usable_kv_cache_tokens))
    return prefill + full + drain


# --- weight sync, offload ------------------------------------------------------------------------------


def weight_sync_seconds(plan: Plan, rates: _Rates, shard: int) -> float:
    """Gather full weights (fp32 shards) or only the adapter, copy into vLLM, and move slept weights over PCIe."""
    facts = model_facts(plan.model.arch)
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    n_lora = lora_params(plan)
    bandwidth = rates.collective(shard)
    if n_lora:
        # Once vLLM holds the base (loaded itself, or pushed at the first sync with a dummy format),
        # each step pushes the fp32 adapter only.
        seconds = ring_seconds(4.0 * n_lora, shard, bandwidth) + rollout.dtype_bytes * n_lora / t / rates.hbm
    else:
        seconds = ring_seconds(4.0 * facts.params, shard, bandwidth) + rollout.dtype_bytes * facts.params / t / rates.hbm
    if offloaded_by_policy(plan, "actor"):
        # The shards the sync gathers live in host RAM under CPUOffloadPolicy.
        seconds += actor_state(plan, shard).params / rates.pcie
    if rollout.free_cache_engine and (rollout.sleep_level == 1 or rollout.layered_summon):
        # Level 1 copies vLLM's weights to host at sleep and back at wake.
        seconds += 2.0 * rollout.dtype_bytes * (facts.params + n_lora) / t / rates.pcie
    return seconds


def offload_seconds(plan: Plan, rates: _Rates, shard: int, profile: Profile) -> float:
    """PCIe traffic of verl's between-phase offload: each load and each offload moves the shard once."""
    moved = 0.0
    actor = actor_state(plan, shard)
    # Under offload_policy verl turns the between-phase offloads off; its traffic is priced in each pass.
    actor_moves = not offloaded_by_policy(plan, "actor")
    if plan.actor.param_offload and actor_moves:
        # Loaded and offloaded around the old-log-prob pass, the update and the weight sync.
        moved += 3 * 2 * actor.params
    if plan.actor.optimizer_offload and actor_moves:
        moved += 2 * actor.optimizer
    if plan.uses_reference and not plan.reference_is_actor and ref_params_on_host(plan):
        # FSDP's own offload copies each layer in for the reference pass; nothing is written back.
        moved += ref_param_bytes(plan, model_facts(plan.model.arch), shard)
    if plan.uses_critic and not offloaded_by_policy(plan, "critic"):
        critic = critic_state(plan, shard)
        if plan.critic.param_offload:
            moved += 2 * 2 * critic.params  # values pass and update
        if plan.critic.optimizer_offload:
            moved += 2 * critic.optimizer
    return moved / rates.pcie


# --- the step --------------------------------------------------------------------------------------------


def predict_step_time(plan: Plan, memory: MemoryReport, profile: Profile = DEFAULT_PROFILE,
                      layout: PlanLayout | None = None) -> StepTime:
    """Seconds of each phase of one step of `plan` at its expected lengths (keys: Phase names, "offload")."""
    layout = layout or plan_layout(plan)
    rates = _Rates(plan, profile)
    lengths = workload_lengths(plan, profile)
    shard = max(1, layout.parallel.fsdp_shard_size)
    # Phases by name, plus "offload" (verl's between-phase moves, which belong to no one phase).
    phases: dict[str, float] = {
        Phase.WEIGHT_SYNC: weight_sync_seconds(plan, rates, shard),
        Phase.ROLLOUT: rollout_seconds(plan, memory, rates, profile, layout, lengths),
    }
    # Only rlplan's runtime runs a CPU plan, and it skips the pass on-policy; verl runs it on GPUs regardless.
    if not (plan.cluster.gpu.is_cpu and reuses_update_log_probs(plan, layout)):
        phases[Phase.OLD_LOG_PROB] = _forward_pass(plan, layout.old_log_prob, rates, shard, profile, lengths,
                                                   critic=False, entropy=True)
    if layout.ref_log_prob is not None:
        phases[Phase.REF_LOG_PROB] = _forward_pass(plan, layout.ref_log_prob, rates, shard, profile, lengths,
                                                   critic=False, entropy=False)
    if layout.critic_values is not None and layout.critic_update is not None:
        phases[Phase.CRITIC_VALUES] = _forward_pass(plan, layout.critic_values, rates, shard, profile,
                                                    lengths, critic=True, entropy=False)
        phases[Phase.CRITIC_UPDATE] = _update_pass(plan, layout.critic_update, rates, shard, profile, lengths,
                                                   critic=True)
    phases[Phase.ACTOR_UPDATE] = _update_pass(plan, layout.actor_update, rates, shard, profile, lengths,
                                              critic=False)
    phases["offload"] = offload_seconds(plan, rates, shard, profile)
    return StepTime(phases)


# verl's `timing_s/<key>` each phase falls under: gen times the weight sync and sleep/wake beside generation
# (in the versions of the published runs), and the actor's loads and offloads run inside its worker calls,
# of which the update moves the most.
VERL_TIMING_OF_PHASE: dict[str, str] = {
    Phase.ROLLOUT: "gen",
    Phase.WEIGHT_SYNC: "gen",
    Phase.OLD_LOG_PROB: "old_log_prob",
    Phase.REF_LOG_PROB: "ref",
    Phase.CRITIC_VALUES: "values",
    Phase.CRITIC_UPDATE: "update_critic",
    Phase.ACTOR_UPDATE: "update_actor",
    "offload": "update_actor",
}


def verl_timing_seconds(step: StepTime) -> dict[str, float]:
    """Predicted seconds under verl's `timing_s/*` keys (gen, old_log_prob, ref, values, update_critic,
    update_actor) and `step`, their sum: what a verl console log prints to compare with."""
    timings: dict[str, float] = {}
    for phase, seconds in step.phase_seconds.items():
        key = VERL_TIMING_OF_PHASE.get(str(phase), str(phase))
        timings[key] = timings.get(key, 0.0) + seconds
    timings["step"] = step.total_seconds
    return timings
