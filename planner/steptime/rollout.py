"""The rollout's step time: each engine's prefill, its decode at the concurrency the KV cache holds, the
drain of its longest responses, and the engine's side of the weight sync (docs/steptime.md, "Rollout")."""

from __future__ import annotations

import math

from attrs import frozen

from rlplan.planner.layout import PlanLayout
from rlplan.planner.memory import MemoryReport
from rlplan.planner.memory.dataproto import batch_bytes
from rlplan.planner.memory.model_facts import lora_params, model_facts
from rlplan.planner.memory.rollout import ROLLOUT_ENGINES
from rlplan.planner.plan import Plan
from rlplan.planner.profile import Profile
from rlplan.planner.steptime.lengths import Lengths, workload_lengths
from rlplan.planner.steptime.passes import transfer_seconds
from rlplan.planner.steptime.rates import Rates

# Points of the drain integral (the batch's last sequences finishing): enough for 1 % on smooth tails.
_DRAIN_POINTS = 48


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
    # A hybrid model's linear-attention layers read and write each running sequence's state every step.
    state_bytes_per_sequence: float = 0.0

    def seconds(self, running: float, context: float) -> float:
        if running <= 0:
            return 0.0
        memory = (self.weight_bytes + running * (context * self.kv_bytes_per_token + self.state_bytes_per_sequence)
                  ) / self.hbm
        per_token = self.matmul_flops_per_token + self.attention_flops_per_context_token * context
        compute = running * per_token / self.achieved_flops
        gpu = max(memory, compute) + self.tp_seconds_fixed + running * self.tp_seconds_per_sequence
        host = self.host_floor + running * self.host_per_sequence
        # The engine's host work and the GPU's kernels overlap; the slower one sets the pace.
        return max(gpu, host)


def decode_step(plan: Plan, rates: Rates, profile: Profile, hbm: float, flops: float,
                concurrency: float) -> DecodeStep:
    """The decode step of one engine of the plan: GPU roofline per TP rank and the engine's host costs.

    One model for every engine: SGLang and TensorRT-LLM are priced with vLLM's host constants (profile.decode_*),
    as no step of either was measured here. TensorRT-LLM always runs CUDA graphs (verl gives it a CudaGraphConfig
    whatever enforce_eager says, trtllm_rollout/trtllm_async_server.py), so it is never eager on a GPU."""
    arch = plan.model.arch
    facts = model_facts(arch)
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    weight_params = float(facts.params)
    if facts.routed_expert_params:
        # Experts no sequence in the batch routed to are not read.
        untouched = (1.0 - arch.num_experts_per_token / arch.num_experts) ** max(1.0, concurrency)
        weight_params -= facts.routed_expert_params * untouched
    eager = (rollout.enforce_eager and rollout.name != "trtllm") or plan.cluster.gpu.is_cpu
    tp_fixed = tp_per_sequence = tp_launch = 0.0
    if t > 1:
        # Two all-reduces of the running batch's hidden states per layer. On the GPU each costs what a captured
        # one does; an eager engine also launches each from Python, and that launch is the engine's host time
        # (it overlaps the GPU's kernels, it does not add to them): the fitted eager latency, which includes
        # the launch, goes to the host side.
        bandwidth = rates.collective(t)
        tp_fixed = 2 * facts.layers * profile.tp_allreduce_graph_latency_us * 1e-6
        if eager:
            tp_launch = 2 * facts.layers * profile.tp_allreduce_latency_us * 1e-6
        hidden_bytes = 2.0 * facts.hidden * rollout.dtype_bytes
        tp_per_sequence = 2 * facts.layers * hidden_bytes * (t - 1) / t / bandwidth
    per_layer = profile.decode_eager_seconds_per_layer if eager else profile.decode_graph_seconds_per_layer
    return DecodeStep(
        weight_bytes=rollout.dtype_bytes * weight_params / t,
        kv_bytes_per_token=arch.kv_cache_bytes_per_token(t, rollout.dtype_bytes),
        state_bytes_per_sequence=2.0 * arch.linear_attention_layers * arch.linear_attention_state_elements(t)
        * rollout.dtype_bytes if arch.linear_attention_layers else 0.0,
        hbm=hbm,
        matmul_flops_per_token=facts.matmul_flops_per_token / t,
        attention_flops_per_context_token=facts.attention_flops_per_context_token / t,
        achieved_flops=flops,
        tp_seconds_fixed=tp_fixed,
        tp_seconds_per_sequence=tp_per_sequence,
        host_floor=profile.decode_step_floor_s + per_layer * facts.layers + tp_launch,
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


def rollout_seconds(plan: Plan, memory: MemoryReport, rates: Rates, profile: Profile, layout: PlanLayout,
                    lengths: Lengths | None = None, responses_per_prompt: int | None = None) -> float:
    """Prefill at FLOPs, a full-concurrency phase while the queue lasts, then the drain to the longest
    response. `responses_per_prompt` prices a generation of the same prompts with another n (ReMax's greedy
    baseline: one each)."""
    lengths = lengths or workload_lengths(plan, profile)
    facts = model_facts(plan.model.arch)
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    prefill_flops, decode_flops, hbm = rates.prefill_flops, rates.decode_flops, rates.hbm
    if layout.parallel.one_rollout_engine:
        # The one engine generates while the trainer ranks wait: every rank's share of cores and bandwidth.
        share = rates.gpus_per_node
        prefill_flops, decode_flops, hbm = prefill_flops * share, decode_flops * share, hbm * share
    sequences = layout.sequences_per_rollout_engine
    if responses_per_prompt is not None:
        sequences = layout.prompts_per_rollout_engine * responses_per_prompt
    prompts = layout.prompts_per_rollout_engine if rollout.enable_prefix_caching else sequences
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


def engine_weight_load_seconds(plan: Plan, rates: Rates) -> float:
    """The engine's side of the weight sync: copy the gathered weights (or the adapter) into its TP shards,
    and under sleep level 1 move its weights to host at sleep and back at wake over PCIe."""
    facts = model_facts(plan.model.arch)
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    n_lora = lora_params(plan)
    seconds = rollout.dtype_bytes * (n_lora or facts.params) / t / rates.hbm
    if plan.rollout_is_split:
        # A pool of its own: the whole state_dict is broadcast from the trainer's rank 0 to every rollout GPU, one
        # tensor at a time, in the trainer's dtype (memory.phases.split_sync_tensor_bytes); the engine never sleeps.
        dtype_bytes = 4 if not plan.is_megatron and plan.actor.model_dtype == "fp32" else 2
        return seconds + dtype_bytes * facts.params / rates.internode
    if rollout.free_cache_engine and ROLLOUT_ENGINES[rollout.name].sleep_copies_weights_to_host(rollout):
        # Level 1 copies vLLM's weights to host at sleep and back at wake (memory.rollout.EngineMemory).
        seconds += 2.0 * rollout.dtype_bytes * (facts.params + n_lora) / t / rates.pcie
    return seconds


def rollout_host_seconds(plan: Plan, profile: Profile, layout: PlanLayout) -> float:
    """What verl's `gen` timer holds beside decoding and the weight sync (v0.4.0): the driver's prompts out to
    the ranks and the generated batch back; each rank's pre- and post-processing of its engine's sequences
    (strip the prompts' padding, pad the responses, masks and position ids); vLLM's wake-up and sleep around the
    sync, which unmap and remap its memory budget (sharding_manager/fsdp_vllm.py, vllm_rollout_spmd.py)."""
    if plan.cluster.gpu.is_cpu:
        return 0.0
    rollout, data = plan.rollout, plan.data
    prompts = layout.generated_prompts
    sequences = prompts * layout.responses_per_prompt
    sent = prompts * 3 * 8.0 * data.max_prompt_length  # input_ids, attention_mask, position_ids
    seconds = transfer_seconds(plan, profile, sent, batch_bytes(plan, sequences, 0))
    seconds += layout.sequences_per_rollout_engine * profile.rollout_host_seconds_per_sequence
    if rollout.free_cache_engine and not plan.rollout_is_split:
        budget_gib = rollout.gpu_memory_utilization * plan.cluster.gpu.memory_gib
        seconds += budget_gib * profile.engine_wake_sleep_seconds_per_gib
    return seconds
