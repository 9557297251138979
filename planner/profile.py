"""The constants the memory and step-time models assume, in one named, editable place.

Every number the models use that is not read from the plan (allocator margins,
vLLM's profiled workspace, the loss-head coefficients, achieved MFU and
bandwidth efficiencies) lives in `Profile`, each with the reason for its
default.  A profile calibrated on a real cluster is a TOML file of these keys;
`load_profile_toml` / `profile_to_toml` are pure text functions (the CLI reads
and writes the files).
"""

from __future__ import annotations

import math
import tomllib
from typing import Any

import attrs
import tomli_w
from attrs import frozen

from rlplan.planner.errors import PlanError, did_you_mean
from rlplan.planner.validators import field_check


def _check_range(low: float, high: float | None, *, open_low: bool = False):
    bound = f"({low}, {high}]" if open_low else f"[{low}, {high if high is not None else 'inf'}]"

    def within(value: float) -> bool:
        too_low = value <= low if open_low else value < low
        # NaN compares false with every bound, and inf is no constant: both are named explicitly.
        finite = not isinstance(value, float) or math.isfinite(value)
        return finite and not (too_low or (high is not None and value > high))

    return field_check("profile", within, f"must lie in {bound}, got {{value}}.", f"set {{field}} to a value in {bound}")


def _converter(kind: type) -> Any:
    """int or float, leaving a value the kind cannot hold (an integer past float's range, inf for an int) for the
    range check to name instead of raising OverflowError."""

    def convert(value: Any) -> Any:
        try:
            return kind(value)
        except (OverflowError, ValueError):
            return math.inf

    return convert


def _constant(default: float, why: str, low: float = 0.0, high: float = math.inf, *, open_low: bool = False,
              kind: type = float) -> Any:
    """A named constant with the finite range it may take: every value a profile can hold is bounded, so no
    product or sum the models form from it overflows."""
    if not math.isfinite(high):
        raise ValueError(f"the constant {why[:40]!r} needs a finite upper bound")
    return attrs.field(
        default=default,
        validator=_check_range(low, high, open_low=open_low),
        converter=_converter(kind),
        metadata={"why": why},
    )


# Where the step-time constants fitted to published runs come from.
FITTED = (" [fitted: benchmarks/steptime_holdout.py --fit, 13 published verl FSDP runs and 4 public logs, from "
          "its PROTOCOL_BASE; error out of sample in docs/accuracy.md 5a]")


# The longest mean sequence length a profile may record: far beyond any model's context, so a larger one is a
# broken metrics file, not a run.
MAX_OBSERVED_LENGTH = 10_000_000

@frozen(kw_only=True)
class Profile:
    """Calibration constants of the memory and step-time models (GiB = 2**30 bytes)."""

    name: str = attrs.field(default="default", metadata={"why": "shown in explain and stored in a plan's prediction"})

    # --- fixed per-GPU costs the CPU tracker cannot see (memory-model.md 2.8) ---
    cuda_context_and_nccl_gib: float = _constant(
        1.5, "CUDA context, cuBLAS workspace and NCCL buffers of the trainer process: 1-2 GiB per GPU", high=16.0)
    fragmentation_fraction: float = _constant(
        0.08, "caching-allocator reserve over allocated trainer memory for a training backend the allocator replay "
              "does not cover (Megatron; memory-model.md 2.8 budgets 5-15 %); FSDP phases take the replay's "
              "stranded bytes instead (memory.allocator_trace)", high=0.5)
    allocator_cache_gib: float = _constant(
        0.0, "GiB a site's process-wide reserved counter holds beyond the replay and "
             "allocator_cache_engine_workspaces: the reserved counter only, never the fit (0: not calibrated; "
             "`calibrate --from-verl-log` fits it from max_memory_reserved beside the prediction)", high=64.0)
    allocator_cache_engine_workspaces: float = _constant(
        5.04, "reserved bytes beyond the allocator replay where vLLM runs in the trainer's process (verl < 0.7) and "
             "the trainer's segments are fixed, in units of the engine's profiled workspace (its tensors at every "
             "decode step's batch size go through the trainer's caching allocator); the reserved counter only, never "
             "the fit [fitted: the mean over the public verl logs of tests/data/verl_logs/public, each reported "
             "against the mean of the others, benchmarks/public_verl_runs.py, docs/accuracy.md 4]", high=64.0)

    # --- vLLM profile run (memory-model.md 2.6, llm-d G6-G8) ---
    vllm_activation_base_gib: float = _constant(
        0.03, "vLLM's profiled peak not explained by the two terms below (fit to llm-d G6/G7)", high=64.0)
    vllm_activation_bytes_per_batched_token_hidden: float = _constant(
        2.5, "dummy forward at max_num_batched_tokens: bytes per token x hidden (Qwen3-0.6B vs 32B, Llama 8B vs 70B)",
        high=1000.0)
    vllm_sampler_bytes_per_seq_vocab: float = _constant(
        38.0, "sampler dummy at max_num_seqs x vocab: fp32 logits, probs and int64 sort indices; fits llm-d "
              "Llama-3.1-8B 4.76, Qwen3 5.56-5.64, gpt-oss 7.38 GiB at 8192 tokens / 1024 seqs", high=1000.0)
    vllm_non_torch_tp1_gib: float = _constant(0.13, "non-torch memory vLLM profiles at TP 1 (llm-d G8)", high=16.0)
    vllm_non_torch_tp_gib: float = _constant(
        0.55, "non-torch memory at TP > 1: NCCL communicators and custom all-reduce buffers (llm-d G8)", high=16.0)
    cuda_graph_pool_gib: float = _constant(
        0.5, "CUDA-graph pool captured after the KV allocation, outside the budget and kept by sleep "
             "(llm-d measured -0.9..+1.0 GiB)", high=16.0)
    vllm_sleep_residual_gib: float = _constant(
        1.0, "what a sleeping vLLM keeps per GPU: its context, NCCL and non-pool tensors (vLLM 0.13: 1.14 GB, G12)",
        high=32.0)
    vllm_block_size: int = _constant(16, "vLLM KV block size in tokens as verl launches it", low=1, kind=int, high=4096)
    # --- SGLang rollout (memory-model.md 5.6, the SGLang/verl memory blog G13) ---
    sglang_cuda_graph_pool_gib: float = _constant(
        2.0, "SGLang's CUDA graphs up to cuda_graph_max_bs, outside mem_fraction_static and kept while paused "
             "(blog G13: 1-3 GB for Qwen2.5-7B on H200)", high=16.0)
    sglang_page_size: int = _constant(
        1, "SGLang's KV page size in tokens (server_args.page_size default; verl does not set it)", low=1, kind=int,
        high=4096)
    # --- TensorRT-LLM rollout (PyTorch backend, as verl's trtllm_rollout/trtllm_async_server.py starts it) ---
    trtllm_tokens_per_block: int = _constant(
        32, "TensorRT-LLM's KV block in tokens (tensorrt_llm/llmapi/llm_args.py KvCacheConfig.tokens_per_block "
            "default; verl does not set it)", low=1, kind=int, high=4096)

    # --- loss head, bytes per token x vocab (memory-model.md 2.4) ---
    head_log_prob_bytes: float = _constant(12.0, "fp32 log-prob head with grad (verl update, entropy_coeff 0); "
                                                 "tracker-measured at h 64, V 65536, T 4096", high=1000.0)
    head_entropy_bytes: float = _constant(32.0, "log-prob + full entropy with grad (tracker-measured); entropy "
                                                "checkpointing does not lower it (the peak is in the logsumexp backward)",
                                   high=1000.0)
    head_chunked_entropy_bytes: float = _constant(24.0, "log-prob + entropy chunked at 2048 rows, with grad "
                                                        "(tracker-measured)", high=1000.0)
    head_forward_only_bytes: float = _constant(14.0, "no_grad log-prob + entropy (old-log-prob and ref passes), "
                                                     "tracker-measured", high=1000.0)

    # --- layout facts verl does not expose per plan (shard dtypes are plan keys: actor/ref.model_dtype) ---
    activation_offload_resident_layers: int = _constant(
        2, "layers whose saved activations stay on the GPU under activation offload (in flight)", kind=int,
        high=1024)
    shm_model_copies_per_node: int = _constant(
        1, "bf16 checkpoint copies per node in /dev/shm or page cache (use_shm, vLLM loading safetensors)", kind=int,
        high=64)
    host_process_gib_per_gpu: float = _constant(
        4.0, "host RSS of the trainer and rollout processes per GPU: CUDA/torch libraries, Python heaps",
        high=1024.0)

    # --- rlplan's own CPU runtime (issues 12, 27, 42): a rank is a process, its memory is its resident set ---
    # A process's RSS is a per-machine baseline (interpreter, libraries, and the pages of the shared libraries the
    # ISA's code paths touch, with the page cache's fault-around) plus a heap that scales with the model
    # (planner/memory/cpu_process.py). `rlplan calibrate --cpu` measures the baseline on the user's machine
    # (cpu_*_baseline_measured_gib); unmeasured, the built-in bounds below stand in, set at or above every
    # machine with evidence. Thread pools are not it: 1 to 32 torch threads moved the trainer's RSS by 0.005 GiB,
    # 2 or 16 OpenMP threads the engine's by none.
    cpu_trainer_process_gib: float = _constant(
        1.15, "built-in bound on the baseline RSS of one CPU trainer rank (beside its priced state and heap) for a "
              "CPU that `rlplan calibrate --cpu` did not measure, an assumption: interpreter, torch, transformers, "
              "Ray worker, gloo, shared-library pages. Baselines with the heap terms below: 0.51 GiB on the 2-core "
              "AVX2 EPYC (issue 42), ~0.69 implied by issue 27's AVX-512-BF16 EPYC (demo 0.77-0.79 GiB), up to "
              "1.15 implied by issue 42's AMX Intel (weight_sync 2.56 GiB on the 8-layer hidden-512 model, against "
              "1.41 GiB these terms price there; its update implies less)", high=64.0)
    cpu_rollout_process_gib: float = _constant(
        1.05, "built-in bound on the baseline RSS of the vLLM CPU engine process (beside its weights, its "
              "VLLM_CPU_KVCACHE_SPACE and the received weight-sync copy) for an unmeasured CPU, an assumption: "
              "0.81 GiB measured on the 2-core AVX2 EPYC (issue 42), ~0.94 implied by issue 27's EPYC (1.97 GiB)",
        high=64.0)
    cpu_trainer_baseline_measured_gib: float = _constant(
        0.0, "this machine's trainer-rank baseline RSS, measured by `rlplan calibrate --cpu` (a short run of the "
             "bundled tiny model: its RSS less what the planner prices); 0: not measured, the built-in "
             "cpu_trainer_process_gib stands in", high=64.0)
    cpu_rollout_baseline_measured_gib: float = _constant(
        0.0, "this machine's engine-process baseline RSS, measured likewise; 0: not measured, the built-in "
             "cpu_rollout_process_gib stands in", high=64.0)
    cpu_trainer_heap_model_copies: float = _constant(
        4.0, "copies of the policy (in its model_dtype) a CPU trainer rank's heap holds beyond the priced tensors "
             "in every phase after the first step: FSDP2's gathered parameters and unsharded gradients, AdamW's "
             "temporaries, the weight sync's full copy (every rank builds it) and rank 0's object-store pages, "
             "which glibc keeps once freed [fitted with the next to the update's peak RSS of three runs on the "
             "2-core AVX2 EPYC, issue 42: the demo, a 6-layer and an 8-layer hidden-512 Qwen2 (3.7 copies, 1.32), "
             "rounded up; held out: `calibrate --cpu`'s run and tests/runtime/test_demo.py's 4-layer hidden-384 "
             "run]", high=1000.0)
    cpu_trainer_heap_fragmentation: float = _constant(
        1.35, "what a CPU trainer rank's heap holds on top of the step's largest trainer phase, as a fraction of "
              "that phase's priced bytes beside the baseline: the CPU kernels' fp32 workspaces and the freed "
              "activations glibc's arenas keep between live blocks (the update's RSS grew 2.3x its priced "
              "transient bytes on the 2-core EPYC) [fitted with the above]", high=10.0)
    cpu_engine_sync_model_copies: float = _constant(
        4.0, "copies of the synced weights (in the engine's dtype) the vLLM CPU engine's process holds beside its "
             "loaded weights: the object store's pages, the unpickled tensors, the loader's copies [fitted on "
             "the demo and the 6-layer run: 3.85 copies, rounded up]", high=1000.0)
    cpu_block_size: int = _constant(
        128, "vLLM CPU's KV block size when none is given (vllm/platforms/cpu.py check_and_update_config, 0.32)",
        low=1, kind=int, high=4096)
    cpu_measured_tflops: float = _constant(
        0.0, "dense fp32 matmul TFLOP/s this machine's cores reached together (`rlplan calibrate --cpu`); 0: not "
             "measured, `solve --device cpu` then estimates it from /proc/cpuinfo", high=1e6)
    cpu_measured_bf16_tflops: float = _constant(
        0.0, "dense bf16 matmul TFLOP/s on the same cores (`rlplan calibrate --cpu`); 0: not measured, estimated "
             "from /proc/cpuinfo's bf16 flags", high=1e6)
    cpu_measured_gbps: float = _constant(
        0.0, "memory copy bandwidth of this machine in GB/s (`rlplan calibrate --cpu`); 0: not measured, "
             "estimated from /proc/cpuinfo", high=1e6)

    # --- the data's lengths a run saw (`calibrate --from-run`); 0: none seen ---
    observed_prompt_length: int = _constant(
        0, "mean prompt tokens per sequence of the run this profile was fitted on; prices fixed micro batches "
           "when a plan sets no data.expected_prompt_length (0: none observed, the maximum is priced)", kind=int,
        high=MAX_OBSERVED_LENGTH)
    observed_response_length: int = _constant(
        0, "mean response tokens per sequence of that run; used likewise for data.expected_response_length",
        kind=int, high=MAX_OBSERVED_LENGTH)

    # --- the margin `solve` keeps (planner/model_error.py) ---
    headroom_floor_fraction: float = _constant(
        0.05, "smallest share of each GPU a solved plan leaves free, whatever the measured rows say: what they "
              "cannot see (fragmentation budgeted at 5-15 % of trainer bytes around the 8 % priced and the CUDA "
              "context at 1-2 GiB around 1.5 (memory-model.md 2.8): ~5 % of an 80 GiB GPU whose trainer holds "
              "~50 GiB), and batches longer than the data's mean", high=0.5)

    unmeasured_backend_under_fraction: float = _constant(
        0.134, "under-prediction assumed for a training backend no measured row covers (Megatron today): the "
               "largest one the FSDP model showed on a code path before that path was measured (the fused loss "
               "head's update, -13.4 %, docs/accuracy.md 1b before issue 24); replaced by the rows once a "
               "backend's peaks are measured", high=0.5)

    # --- throughput (memory-model.md 2.9) ---
    training_mfu: float = _constant(
        0.50, "achieved FLOP/s of FSDP training over peak on FLOP-dense GPUs, counting gradient "
              "checkpointing's recompute: torchtitan Llama-3.1-8B on H100 reaches 33-39 % MFU, verl FSDP "
              "H100 runs 0.27-0.44 (6N MFU; x4/3 with recompute)" + FITTED, high=1.0, open_low=True)
    prefill_mfu: float = _constant(
        0.45, "achieved MFU of vLLM prefill: long dense GEMMs, no backward", high=1.0, open_low=True)
    decode_mfu: float = _constant(
        0.163, "fraction of peak FLOP/s a decode step's matmuls reach (skinny GEMMs of the running batch); "
              "binds on FLOP-poor GPUs such as the H20 (148 TFLOP/s against 4 TB/s)" + FITTED,
        high=1.0, open_low=True)
    decode_hbm_efficiency: float = _constant(
        0.7, "fraction of peak HBM bandwidth decode reaches reading weights and KV", high=1.0, open_low=True)
    pcie_efficiency: float = _constant(
        0.7, "fraction of PCIe bandwidth pinned host<->device copies reach", high=1.0, open_low=True)
    cpu_adam_params_per_s: float = _constant(
        0.8e9, "fp32 parameters per second one node's CPUs step with torch's AdamW under FSDP2 CPUOffloadPolicy, "
               "shared by the node's ranks: memory-bound at ~28 B/param over several passes; ZeRO-Offload (Ren et "
               "al. 2021) measured PyTorch's CPU Adam at ~1.4 s per 1B params, torch's foreach AdamW is faster",
        open_low=True, high=1e13)
    collective_efficiency: float = _constant(
        0.7, "fraction of link bandwidth NCCL all-gather / reduce-scatter reach", high=1.0, open_low=True)
    tp_allreduce_latency_us: float = _constant(
        135.0, "host time of one small tensor-parallel all-reduce in an eager decode step, launched from "
               "Python (two per layer; the GPU side costs tp_allreduce_graph_latency_us)" + FITTED, high=10_000.0)
    tp_allreduce_graph_latency_us: float = _constant(
        10.0, "latency of one small tensor-parallel all-reduce in a decode step replayed from CUDA graphs "
              "(NCCL / custom all-reduce within a node; estimate, no published sweep ran with graphs)",
        high=10_000.0)

    # --- step time at real lengths (issue 29, docs/steptime.md) ---
    unstated_length_fraction: float = _constant(
        0.3, "mean prompt and response length as a fraction of the maxima when neither the plan "
             "(data.expected_*_length) nor a calibrated profile states them: published runs' means lie at "
             "0.07-0.3 of their maxima (DAPO 2k/20k: prompts ~160, responses 0.8-3.7k; GSM8K 512/1024)",
        high=1.0, open_low=True)
    response_length_sigma: float = _constant(
        0.37, "shape of the log-normal response lengths a batch draws from (the tail parameter): the "
             "batch's decode ends with its longest responses" + FITTED, high=4.0)
    training_mfu_light_gpu: float = _constant(
        0.77, "training_mfu on GPUs below training_mfu_dense_gpu_tflops: published verl FSDP runs on H20 "
              "report 0.57-0.67 MFU (verl_megatron_practice dapo14b/dapo32b.csv), x4/3 with recompute"
              + FITTED,
        high=1.0, open_low=True)
    training_mfu_dense_gpu_tflops: float = _constant(
        400.0, "bf16 dense TFLOP/s from which a GPU is FLOP-dense and reaches training_mfu (H100 989) rather "
               "than training_mfu_light_gpu (H20 148, A100 312)", high=1e6)
    micro_batch_seconds_per_layer: float = _constant(
        1.7e-3, "fixed cost per micro batch, layer and pass (forward = 1, backward 2 more): Python, "
                 "launches, FSDP hooks; what makes small models run below any FLOPs roofline" + FITTED,
        high=1.0)
    entropy_bytes_per_token_vocab: float = _constant(
        16.0, "HBM bytes per token x vocab of the entropy over fp32 logits (old-log-prob pass; the reference "
              "pass skips it): softmax, log-softmax and the product, read and written", high=1024.0)
    decode_step_floor_s: float = _constant(
        3.4e-3, "host time of one decode step beside its layers: scheduling, sampling, output processing"
                + FITTED, high=1.0)
    decode_eager_seconds_per_layer: float = _constant(
        0.71e-3, "host time per layer of an eager decode step (rollout.enforce_eager, verl's default before "
                 "Aug 2025): each kernel launched from Python" + FITTED, high=1.0)
    decode_graph_seconds_per_layer: float = _constant(
        0.02e-3, "host time per layer of a decode step replayed from CUDA graphs: one graph launch per step, "
             "estimated (no published sweep ran with graphs); the floor and per-sequence cost still apply",
        high=1.0)
    decode_seconds_per_sequence: float = _constant(
        25e-6, "host time per running sequence and decode step of one engine (scheduling, sampling, "
               "detokenizing): one engine's tokens per second do not grow with its TP size" + FITTED,
        high=1.0)

    # --- a step's fixed costs: what verl times inside its phases beside the passes (issue 40) ---
    worker_call_seconds: float = _constant(
        0.052, "host time of one worker-group call beside its data: Ray's remote call to every rank and the gather "
              "of their results, the Ulysses sharding manager's enter and exit, FSDP1's root reshard, the "
              "`empty_cache` verl calls around offloads (verl/single_controller/ray/base.py "
              "execute_all, fsdp_workers.py compute_log_prob / update_actor, v0.4.0)" + FITTED, high=60.0)
    dataproto_gbps: float = _constant(
        1.14, "GB/s at which the driver ships a worker call's DataProto to the ranks and back: torch.save of each "
             "chunk into bytes, Ray's object store, torch.load on the rank, torch.cat of the results "
             "(verl/protocol.py __getstate__, DataProto.concat). benchmarks/host_costs.py rebuilds it on this "
             "CPU at 0.01-0.02 GB/s (0.04-0.12 scaled to the logs' host by their timing_s/adv), which the logs' "
             "passes rule out (7B PPO recommended: 0.4 GB a call, old_log_prob within 1 s of its compute)"
             + FITTED, low=1e-3, high=1e3)
    pageable_copy_gbps: float = _constant(
        10.1, "GB/s of verl's between-phase offloads: `flat_param.data.to('cpu')` and back, to and from pageable "
              "host memory (verl/utils/fsdp_utils.py offload_fsdp_model_to_cpu / load_fsdp_model_to_gpu, "
              "offload_fsdp_optimizer), well below pinned PCIe" + FITTED, low=1e-3, high=1e3)
    optimizer_step_seconds_per_layer: float = _constant(
        1.1e-3, "host time per optimizer step and layer beside AdamW's HBM pass: the grad-norm clip and its "
                "isfinite check (a device sync), the optimizer's per-tensor launches, zero_grad, the LR "
                "scheduler (verl/workers/actor/dp_actor.py _optimizer_step)" + FITTED, high=1.0)
    reward_seconds_per_sequence: float = _constant(
        1.41e-4, "driver time per response of a rule reward (timing_s/reward): verl's NaiveRewardManager "
                "decodes each response and scores it in a Python loop (verl/workers/reward_manager/naive.py); "
                "the public GSM8K logs time 0.14-0.15 ms per response at 512-5120 responses" + FITTED,
        high=1.0)
    gae_seconds_per_position: float = _constant(
        2.5e-5, "driver time per response position of GAE (timing_s/adv): verl's compute_gae_advantage_return "
                "steps backwards over the positions with a few torch ops each on the batch's column "
                "(verl/trainer/ppo/core_algos.py)" + FITTED, high=1.0)
    gae_seconds_per_token: float = _constant(
        3.9e-8, "driver time per response token (batch x max response) of GAE and the advantage whitening"
                + FITTED, high=1.0)
    grouped_advantage_seconds_per_sequence: float = _constant(
        2.6e-5, "driver time per response of a group advantage (GRPO, RLOO, ...: a Python loop that groups the "
                "scores by prompt uid, core_algos.compute_grpo_outcome_advantage)" + FITTED, high=1.0)
    rollout_host_seconds_per_sequence: float = _constant(
        1.0e-4, "rollout worker's host time per response beside decoding: strip each prompt's left padding, "
                "pad each response to the maximum, build masks and position ids "
                "(verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py generate_sequences): benchmarks/"
                "host_costs.py measures 440-900 us here, 80-130 us scaled to the logs' host by their timing_s/adv",
        high=1.0)
    engine_wake_sleep_seconds_per_gib: float = _constant(
        0.0174, "seconds per GiB of the engine's memory budget to wake it and put it back to sleep each step: "
              "vLLM's CuMemAllocator unmaps and remaps the pool chunk by chunk, around the weight sync "
              "(verl/workers/sharding_manager/fsdp_vllm.py __enter__ / __exit__)" + FITTED, high=10.0)

    def why(self, key: str) -> str:
        return attrs.fields_dict(type(self))[key].metadata["why"]


DEFAULT_PROFILE = Profile()

_KEYS = tuple(a.name for a in attrs.fields(Profile))


def _has_type(value: Any, expected: type) -> bool:
    """TOML's own types: integers are accepted for floats, integral floats for integers, booleans for neither."""
    if isinstance(value, bool):
        return False
    if expected is str:
        return isinstance(value, str)
    if expected is int:
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return isinstance(value, int | float)


def load_profile_toml(text: str, source: str = "profile.toml") -> Profile:
    """A Profile from TOML text: top-level keys (or a [profile] table); missing keys keep their defaults."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:  # ValueError: an integer too long to convert
        raise PlanError(field="profile", message=f"{source} is not valid TOML: {exc}.",
                        fix="fix the TOML syntax at the position given") from None
    except RecursionError:
        raise PlanError(field="profile", message=f"{source} is nested too deeply to read.",
                        fix="a profile is flat: one key = value per line") from None
    if set(data) == {"profile"} and isinstance(data["profile"], dict):
        data = data["profile"]
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _KEYS:
            hint = did_you_mean(key, _KEYS, otherwise=f"valid keys: {', '.join(_KEYS)}", cutoff=0.6)
            raise PlanError(field=f"profile.{key}", message=f"is not a profile key in {source}.", fix=hint)
        expected = type(getattr(DEFAULT_PROFILE, key))
        if not _has_type(value, expected):
            raise PlanError(field=f"profile.{key}", message=f"expected {expected.__name__}, got {value!r}.",
                            fix=f"set profile.{key} to a {expected.__name__}, e.g. {getattr(DEFAULT_PROFILE, key)!r}")
        values[key] = value
    return Profile(**values)


def profile_to_toml(profile: Profile) -> str:
    """TOML text of every key, each preceded by the reason for its value; load_profile_toml reads it back exactly."""
    lines = []
    for attribute in attrs.fields(Profile):
        value = getattr(profile, attribute.name)
        lines.append(f"# {attribute.metadata['why']}")
        lines.append(tomli_w.dumps({attribute.name: value}).rstrip("\n"))
    return "\n".join(lines) + "\n"
