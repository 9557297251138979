"""The Megatron backend's per-rank memory (planner/memory/megatron.py) against Megatron-Core's own estimate and
verl's published Megatron runs.

    python benchmarks/megatron_memory.py                           # the tables, on stdout
    python benchmarks/megatron_memory.py --write docs/accuracy.md  # regenerate its section 6 in place

Megatron-Core's estimate is megatron/training/theoretical_memory_usage.py, restated in
tests/planner/test_memory_megatron.py (which holds rlplan to it exactly on the shapes it covers).
verl's runs are its own example scripts in tests/data/verl_scripts/, imported as `rlplan import verl` does, and
the published Megatron runs of benchmarks/data/steptime_sweeps_megatron.toml, built as benchmarks/steptime_sweeps.py
builds them and priced at their mean lengths: they ran, so each must fit on the GPU it ran on (and at their
maximum lengths, the tail of verl's soft token budget, shown beside).
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from pathlib import Path
from statistics import NormalDist

import attrs
from attrs import frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.allocator_trace import allocator_config
from rlplan.planner.memory.megatron import (
    MEGATRON,
    VERL_SAVES_DROPOUT_MASKS,
    optimizer_step_bytes,
    stage_activations,
    state_on_most_loaded_rank,
)
from rlplan.planner.memory.phases import MemoryReport, at_max_length
from rlplan.planner.memory.rollout import rollout_budget
from rlplan.planner.plan import MegatronSection, Plan
from rlplan.planner.presets import resolve_gpu, resolve_model
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.steptime.lengths import workload_lengths
from rlplan.planner.verl_import import import_verl_script

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sections import print_or_write_section  # noqa: E402
from steptime_sweeps import MEGATRON_DATA, load_sweeps, run_plan  # noqa: E402

from tests.planner.test_memory_megatron import megatron_activations, megatron_weights_and_optimizer  # noqa: E402

SECTION_HEADING = "## 6. Megatron backend: per-rank memory against Megatron-Core's estimate and verl's runs"
GIB = 2**30
SEQ, MICRO = 4096, 1

# (model preset, world, TP, PP, VPP, micro batches per mini batch)
CONFIGURATIONS = (
    ("llama-3.1-8b", 8, 2, 1, None, 8),
    ("llama-3.1-8b", 16, 2, 2, None, 8),
    ("qwen2.5-7b", 8, 4, 1, None, 4),
    ("llama-3.1-70b", 32, 8, 4, None, 16),
    ("llama-3.1-70b", 64, 8, 4, 2, 16),
)

# verl's example script, the GPU it names (or the 80 GB H100 where it names none), --env pins, what a public report
# says happened when it ran ("" where none is known), and the verl release it is priced at (as --verl-version) with
# the reason: the release of the commit the script was taken from, not rlplan's default.
B178 = ("0.7.1", "commit b178a3cd (2026-01-29; its version file says 0.8.0.dev) is in the v0.7.1 tag, and like v0.7.1 "
        "its main_ppo.py keeps the legacy workers by default (trainer.use_legacy_worker_impl=auto)")
VERL_RUNS = (
    ("megatron_dense_qwen2_7b.sh", "h100-80g", {"HOME": "/h"}, "", B178),
    ("megatron_moe_lora_qwen3_30b_a3b.sh", "h100-80g", {"HOME": "/h"}, "", B178),
    ("megatron_moe_qwen3_30b_a3b.sh", "h20-96g", {"HOME": "/h", "TEST_FILE": "/data/aime-2024.parquet"},
     "out of memory on 8 nodes, phase not given (verl issue 3364)", B178),
    ("megatron_moe_deepseek_v3_256_h100.sh", "h100-80g",
     {"HOME": "/h", "CKPT_DIR": "/c", "LLM": "deepseek-ai/DeepSeek-V3", "RAY_DATA_HOME": "/r", "TRAIN_FILE": "/t",
      "TEST_FILE": "/t"}, "", B178),
    ("megatron_dense_qwen2_32b_tp8_h20.sh", "h20-96g", {"HOME": "/h"},
     "out of memory in the distributed optimizer's step (verl issue 3124)",
     ("0.5.0", "commit 9f4161e2 (2025-08-12, v0.5.0-111, version file 0.5.0.dev; the run was reported on 2025-08-19) "
               "still moves the update's whole batch onto the GPU as v0.5.0 does (megatron_workers.py line 623), which "
               "v0.6.0 removed; its rollout.enforce_eager default is already False (rollout.yaml line 35), kept so")),
)
# What a row's tree defaults to where its pinned release defaults otherwise (the tree's config, read at its commit).
TREE_DEFAULTS = {"megatron_dense_qwen2_32b_tp8_h20.sh": {"enforce_eager": False}}


def _error(ours: float, theirs: float) -> str:
    return f"{100 * (ours - theirs) / theirs:+.1f} %"


def estimate_rows() -> list[str]:
    rows = ["| model | GPUs | TP x PP (x VPP) | weights + grads + optimizer: Megatron-Core / rlplan GiB | "
            "activations, ungated shape: Megatron-Core / rlplan GiB | rlplan, the model's gated MLP and GQA |",
            "|---|---|---|---|---|---|"]
    for name, world, tp, pp, vpp, micro_batches in CONFIGURATIONS:
        arch: Architecture = resolve_model(name).arch
        engine = MegatronSection(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 virtual_pipeline_model_parallel_size=vpp)
        theirs_state = megatron_weights_and_optimizer(arch, tp=tp, pp=pp, dp=world // (tp * pp), distributed=True)
        ours_state = state_on_most_loaded_rank(arch, engine, world).total
        mha = attrs.evolve(arch, num_kv_heads=arch.num_attention_heads)
        theirs_act = megatron_activations(mha, seq=SEQ, micro=MICRO, tp=tp, pp=pp, vpp=vpp,
                                          micro_batches=micro_batches)
        ungated = stage_activations(mha, engine, tokens_per_micro_batch=SEQ * MICRO, micro_batches=micro_batches,
                                    gated=False, rotary_outputs=False).first
        gated = stage_activations(arch, engine, tokens_per_micro_batch=SEQ * MICRO, micro_batches=micro_batches,
                                  dropout_masks=VERL_SAVES_DROPOUT_MASKS).peak
        layout = f"{tp} x {pp}" + (f" x {vpp}" if vpp else "")
        rows.append(f"| {name} | {world} | {layout} | {theirs_state / GIB:.2f} / {ours_state / GIB:.2f} "
                    f"({_error(ours_state, theirs_state)}) | {theirs_act / GIB:.2f} / {ungated / GIB:.2f} "
                    f"({_error(ungated, theirs_act)}) | {gated / GIB:.2f} ({_error(gated, theirs_act)}) |")
    return rows


def verl_run_rows() -> list[str]:
    rows = ["| verl example | GPUs | parallelism | priced at verl | peak phase | rlplan peak GiB (resident) | of GPU GiB "
            "| fits | reported |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, gpu, _, outcome, (release, _why) in VERL_RUNS:
        plan = _example_plan(name)
        report = predict_memory(plan)
        engine = plan.actor.mcore
        parallel = (f"TP {engine.tensor_model_parallel_size} PP {engine.pipeline_model_parallel_size} "
                    f"CP {engine.context_parallel_size} EP {engine.expert_model_parallel_size}")
        peak = report.peak_phase
        at = f" ({peak.peak_at})" if peak.peak_at else ""
        rows.append(f"| `{name}` | {plan.cluster.world_size} x {gpu} | {parallel} | {release} | {peak.name}{at} | "
                    f"{report.gpu_peak_bytes / GIB:.1f} | {plan.cluster.gpu.memory_gib:.0f} | "
                    f"{'yes' if report.gpu_peak_bytes < report.gpu_capacity_bytes else 'no'} | {outcome or '-'} |")
    return rows


def release_reasons() -> str:
    """Why each example is priced at its release, each reason once."""
    reasons: dict[tuple[str, str], list[str]] = {}
    for name, _, _, _, pin in VERL_RUNS:
        reasons.setdefault(pin, []).append(f"`{name}`")
    return "; ".join(f"{', '.join(names)} at {release}: {why}" for (release, why), names in reasons.items())


def optimizer_step_paragraph() -> str:
    """The dense TP 8 example that died in the optimizer's step: its update's moments as priced."""
    plan = _example_plan("megatron_dense_qwen2_32b_tp8_h20.sh")
    report = predict_memory(plan)
    update = report.phase("actor_update")
    capacity = report.gpu_capacity_bytes
    batch = sum(c.bytes for c in update.components if c.name == "resident_batch")
    verdict = ("so it does not fit, as the run did not" if update.peak_bytes >= capacity else
               "so it still fits, by less than the 13 % margin `solve` keeps: the row stays a miss")
    state = MEGATRON.role_state(plan, "actor", plan_layout(plan))
    resident = state.params + state.grads + state.optimizer
    # a dense model: its one optimizer group is the whole state
    foreach = optimizer_step_bytes(state.optimizer, foreach=True)
    return (
        "verl's Qwen2.5-32B example for 8 H20 (`qwen2_32B_grpo_8_h20_megatron_vllm.sh` at verl 9f4161e2: TP 8, "
        "DP 1, so the distributed optimizer shards nothing; param, grad and optimizer offload; 8,192-token "
        "micro batches) ran out of memory in Megatron's `DistributedOptimizer.step_with_ready_grads` -> "
        "`self.optimizer.step()` (verl-project/verl issue 3124, 2025-08-19). rlplan prices its update's state at "
        f"{resident / GIB:.1f} GiB (bf16 weights, fp32 grads, fp32 main params and moments of 4.1 B parameters "
        f"a rank), the step's temporaries at {state.optimizer_step / GIB:.1f} GiB (Megatron-Core's fused Adam, "
        "Transformer Engine's, which verl's TE-built models guarantee is installed, updates in place: "
        "`VERL_MEGATRON_STEPS_FUSED_ADAM`; torch's foreach AdamW, megatron-core's Adam only without TE and Apex, "
        f"would add {foreach / GIB:.1f} GiB), and the update's peak at {update.peak_bytes / GIB:.2f} GiB "
        f"({update.peak_at}) of the H20's {capacity / GIB:.2f}, the rank's share of the step's batch included "
        f"({batch / GIB:.2f} GiB, which verl of that commit holds on the GPU for the whole update: "
        f"stack.WORKER_HOLDS_BATCH_ON_GPU): {verdict}, and the step is "
        f"{'' if update.peak_at == 'optimizer_step' else 'not '}the priced peak. The report does not say how far "
        "into the update the run got, or what else held memory at the step (verl 0.5's offload and vLLM's "
        "sleeping engine).")


def _example_plan(name: str):
    script, gpu, env, _, (release, _why) = next(run for run in VERL_RUNS if run[0] == name)
    plan = import_verl_script((ROOT / "tests" / "data" / "verl_scripts" / script).read_text(),
                              gpu=resolve_gpu(gpu), host_memory_gib=2048.0, env=env,
                              local_config_reader=lambda path: None, versions=(release, None, None)).plan
    tree = TREE_DEFAULTS.get(script)
    return attrs.evolve(plan, rollout=attrs.evolve(plan.rollout, **tree)) if tree else plan


@frozen
class PublishedRun:
    """A published Megatron run as rlplan prices it: at the run's mean lengths (`plan`, `report`) and at its
    maximum lengths (`tail`: under verl's soft token budget, one max-length sequence over the budget, the worst
    mix of lengths). `died` is the table's own outcome (it ran out of memory); a run with step times ran."""

    label: str
    plan: Plan
    report: MemoryReport
    tail: MemoryReport
    died: bool = False

    @property
    def verdict_right(self) -> bool:
        return self.report.fits != self.died


# A published run whose verdict rlplan gets wrong, and why (the test holds each to still being wrong, so that a fix
# removes it here).
KNOWN_MISSES = {
    "Qwen2.5-7B-Instruct row 4: tp2cp2, utilization 0.8": (
        "ran out of memory; priced to fit with 3.1 GiB left (inside the margin `solve` keeps). At verl 0.5.0's vLLM "
        "(0.8.5, V1 sizing its KV cache from the whole GPU) the engine's budget absorbs the trainer state resident at "
        "its start. From vLLM 0.9.1 the engine refuses to start when the GPU's free memory is below util x GPU, which "
        "rlplan prices (memory/rollout.py free_at_engine_start) and which refuses this row (below); the table does "
        "not say which vLLM ran, so the row stays priced at the release its sweep names, and a miss"),
}


def published_runs(path: Path = MEGATRON_DATA) -> list[PublishedRun]:
    """Every run of the TOML, its plan built by steptime_sweeps.run_plan (the run's mean lengths, the sweep's
    verl release), priced as it is and at its maximum lengths (at_max_length)."""
    runs = []
    for sweep in load_sweeps(path).values():
        for run in sweep["run"]:
            plan = run_plan(sweep, run)
            runs.append(PublishedRun(label=f"{plan.model.path.rpartition('/')[2]} row {run['id']}", plan=plan,
                                     report=predict_memory(plan),
                                     tail=predict_memory(at_max_length(plan)), died="outcome" in run))
    return runs


def largest_differencing_partition(lengths: list[int], parts: int) -> list[int]:
    """The token totals of the `parts` groups the largest differencing method (Karmarkar-Karp) makes of
    `lengths`, as verl's get_seqlen_balanced_partitions(..., equal_size=False) runs it (verl/utils/
    seqlen_balancing.py karmarkar_karp, read at v0.4.1 and v0.5.0): every length starts as its own partial
    solution (it, then parts - 1 empty groups); the two partial solutions of largest spread are merged, the
    heaviest group of one beside the lightest of the other, until one is left."""
    heap: list[tuple[int, int, list[int]]] = []
    for order, length in enumerate(sorted(lengths)):
        heapq.heappush(heap, (-length, order, [length] + [0] * (parts - 1)))
    order = len(lengths)
    while len(heap) > 1:
        first, second = heapq.heappop(heap)[2], heapq.heappop(heap)[2]
        merged = sorted((a + b for a, b in zip(first, reversed(second), strict=True)), reverse=True)
        order += 1
        heapq.heappush(heap, (merged[-1] - merged[0], order, merged))
    return heap[0][2]


def partition_at_run_lengths(plan: Plan) -> int | None:
    """The largest update micro batch (tokens per rank, after CP's split) verl's rearrange_micro_batches makes
    of one mini batch of a rank at the run's lengths: ceil(tokens / budget) groups balanced by Karmarkar-Karp,
    none capped (verl < 0.9.1). The lengths are the workload's (the run's mean prompt, log-normal responses of
    its mean and the profile's shape, cut at max_response_length) at evenly spaced quantiles."""
    role = plan_layout(plan).actor_update
    if role.max_token_len_per_gpu is None:
        return None  # fixed micro batches: no partition
    workload = workload_lengths(plan, DEFAULT_PROFILE)
    count = role.chunk_size
    normal = NormalDist(workload.log_median, workload.sigma)
    lengths = [round(workload.prompt_mean) + min(workload.response_max, max(1, round(math.exp(
        normal.inv_cdf((i + 0.5) / count))))) for i in range(count)]
    budget = (role.max_token_len_per_gpu or 0) * role.sequence_parallel_size
    parts = min(count, math.ceil(sum(lengths) / budget))
    return math.ceil(max(largest_differencing_partition(lengths, parts)) / role.sequence_parallel_size)


def _layout(plan: Plan) -> str:
    engine = plan.actor.mcore
    parts = [f"TP {engine.tensor_model_parallel_size}", f"PP {engine.pipeline_model_parallel_size}"]
    parts += [f"{name} {size}" for name, size in (("VPP", engine.virtual_pipeline_model_parallel_size),
                                                   ("CP", engine.context_parallel_size),
                                                   ("EP", engine.expert_model_parallel_size)) if size and size > 1]
    if engine.recompute_granularity == "full":
        parts.append("full recompute")
    return " ".join(parts)


def _verdict(report: MemoryReport) -> str:
    return "fits" if report.fits else "**does not fit**"


def published_run_rows(runs: list[PublishedRun]) -> list[str]:
    rows = ["| published run | GPUs | layout | outcome | mean tokens a sequence | update tokens per micro batch "
            "and rank: verl's partition at the run's lengths / priced / at the tail | peak phase | resident peak GiB "
            "at the run's lengths | rlplan's verdict | right | resident peak GiB at the tail | fits at the tail |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        report, plan = run.report, run.plan
        peak = report.peak_phase
        at = f" ({peak.peak_at})" if peak.peak_at else ""
        tokens = plan_layout(plan).actor_update.tokens_per_micro_batch
        tail_tokens = plan_layout(at_max_length(plan)).actor_update.tokens_per_micro_batch
        partition = partition_at_run_lengths(plan)
        rows.append(f"| {run.label} | {plan.cluster.world_size} x {plan.cluster.gpu.name} | {_layout(plan)} | "
                    f"{'out of memory' if run.died else 'ran'} | {plan.data.expected_sequence_length} | "
                    f"{'-' if partition is None else partition} / {tokens} / {tail_tokens} | {peak.name}{at} | "
                    f"{report.gpu_peak_bytes / GIB:.1f} of {report.gpu_capacity_bytes / GIB:.1f} | "
                    f"{_verdict(report)} | {'yes' if run.verdict_right else '**no**'} | "
                    f"{run.tail.gpu_peak_bytes / GIB:.1f} | {'yes' if run.tail.fits else 'no'} |")
    return rows


def published_runs_paragraph(runs: list[PublishedRun]) -> str:
    ran = [run for run in runs if not run.died]
    died = [run for run in runs if run.died]
    tightest = min(ran, key=lambda run: run.report.headroom_bytes)
    over_at_tail = [run.label for run in ran if not run.tail.fits]
    misses = [run for run in runs if not run.verdict_right]
    return (
        f"verl's published Megatron runs (benchmarks/data/{MEGATRON_DATA.name}, ISEEKYAN/verl_megatron_practice's "
        "tables: their step times are section 5b's), each built as benchmarks/steptime_sweeps.py builds it, at "
        "the verl release its sweep names (the tables' commit dates; docs/megatron.md) and at the run's mean "
        f"lengths (derived per row, the TOML's lengths_source). {len(ran)} ran and {len(died)} ran out of memory "
        "(the NV GRPO table's rows marked OOM, phase not given). rlplan calls "
        f"{sum(run.report.fits for run in ran)} of the {len(ran)} that ran fitting (least headroom "
        f"{tightest.report.headroom_bytes / GIB:.1f} GiB, {tightest.label}) and "
        f"{sum(not run.report.fits for run in died)} of the {len(died)} that died not fitting"
        + (": " + "; ".join(f"{run.label} is the miss ({KNOWN_MISSES.get(run.label, 'not explained')})"
                           for run in misses) if misses else "") + ". "
        "The runs that died without offload at TP 2 hold their weights, fp32 gradient buffer and main weights on "
        "the GPU when verl builds the engine (Megatron-Core allocates the last two when it builds the model and the "
        "optimizer), which the engine's budget of the whole GPU then lacks: rlplan finds no room for a KV cache. "
        "verl of these tables balances ceil(tokens / budget) micro batches by Karmarkar-Karp and caps none "
        "(stack.SOFT_TOKEN_BUDGET): rlplan prices a dynamic micro batch one sequence of the priced length over the "
        "budget. At the run's lengths that is above what verl's partition makes of them (the first token figure: "
        "the partition run on the workload's log-normal lengths of the run's mean, within a few percent of the "
        "budget), so the verdict errs high. At the maximum lengths (the last two columns) one max-length sequence "
        "over the budget is the bound of the worst mix of lengths (a partition's spread stays under its longest "
        "sequence; a batch of equal max-length sequences splits exactly); fixed micro batches hold their "
        "sequences at the maximum: there " + str(len(over_at_tail)) + " of the runs that ran do not fit ("
        + ", ".join(label.partition(":")[0] for label in over_at_tail) + "), so a step whose lengths came out "
        "that badly could run out of memory; their mean lengths never came near it. A verdict at the maximum "
        "lengths is the tail, not the run. For the runs that ran the check is one-sided: no peak was published, "
        "so how far rlplan over-predicts them is unknown; the routed experts' activations assume balanced "
        "routing (k / TP copies per token on each rank), and a rank the router favours holds more. "
        "tests/planner/test_memory_megatron.py holds every verdict but the known misses right. "
        + start_check_sentence(runs))


# The first vLLM whose V1 worker refuses to start below util x GPU free (stack.VLLM_REFUSES_SHORT_FREE_MEMORY).
START_CHECK_VLLM = "0.9.1"


def start_check_sentence(runs: list[PublishedRun]) -> str:
    """The published runs' verdicts were vLLM 0.9.1's (its start-up refusal) the engine they ran: which would not
    start, and how much room the tightest of those that ran keeps."""
    budgets = {run.label: (run, rollout_budget(run.plan.evolve(stack=attrs.evolve(run.plan.stack,
                                                                                  vllm=START_CHECK_VLLM))))
               for run in runs}
    refused = [(run, budget) for run, budget in budgets.values() if not budget.starts]
    ran = [(run, budget) for run, budget in budgets.values() if not run.died]
    tightest_run, tightest = min(ran, key=lambda pair: (pair[1].free_at_start_bytes or 0) - pair[1].requested_bytes)
    return (
        f"On vLLM {START_CHECK_VLLM} (the first whose V1 worker refuses to start when the GPU's free memory is below "
        "util x GPU; verl v0.5.0's vllm extra allows up to 0.8.5, v0.6.0's up to 0.9.1) the engine would refuse to "
        "start on " + ("; ".join(
            f"{run.label.partition(':')[0]} ({'died' if run.died else 'ran'}: "
            f"{(budget.free_at_start_bytes or 0) / GIB:.1f} GiB free at its start, "
            f"{budget.requested_bytes / GIB:.1f} GiB requested)" for run, budget in refused) or "none")
        + f" and on {sum(not budget.starts for _, budget in ran)} of the {len(ran)} that ran (the least room, "
        f"{((tightest.free_at_start_bytes or 0) - tightest.requested_bytes) / GIB:.1f} GiB, "
        f"{tightest_run.label.partition(':')[0]}).")


def moe_full_example_paragraph() -> str:
    """The MoE full fine-tuning example's update, term by term, with the numbers the model prices now."""
    plan = _example_plan("megatron_moe_qwen3_30b_a3b.sh")
    report = predict_memory(plan)
    update = report.phase("actor_update")

    def gib(*names: str) -> str:
        return f"{sum(update.bytes_of(name) for name in names) / GIB:.1f} GiB"

    reserve = update.bytes_of("fragmentation_reserve")
    segments = "expandable" if allocator_config(plan, trainer_phase=True).expandable_segments else "fixed"
    fits = "within" if update.peak_bytes <= plan.cluster.gpu.memory_gib * GIB else "above"
    return (
        "The MoE full fine-tuning example (Qwen3-30B-A3B, EP 8, TP 1 PP 1, dynamic batches of 10240 tokens, no "
        f"recompute, the optimizer on the CPU) prices its update {fits} the H20's 96 GB, term by term from the code: "
        f"bf16 weights {gib('actor_params')} and fp32 grads {gib('actor_grads')} (5.16 B parameters per rank: "
        "1.54 B dense + 29.0 B experts / EP 8; verl's get_model and mbridge's get_model both build Megatron's DDP "
        "with grad_reduce_in_fp32 and verl loads the grad buffer back before the update; the precision-aware CPU "
        f"optimizer keeps master weights and moments on the host), layer activations {gib('activations')} (per "
        "token per layer: 8 routed copies x (fc1's saved input 2 h, the fc1 output weighted SwiGLU saves 4 f, "
        "fc2's saved input 2 f) = 68 KiB; attention 35 KiB, with Qwen3's QK norms saving the query's copy and the "
        "fused QKV output beside the rotary Q and K core attention saves; the norms' and linears' inputs 16 KiB; "
        "fp32 router scores 0.5 KiB; no dropout masks at hidden_dropout 0), the loss head "
        f"{gib('logits_head')} at the update's peak, the head's backward (Megatron's fp32 vocab-parallel "
        "logits, then the backward of verl's in-place temperature division on the logits' transposed view: 8 "
        "bytes per token x vocab; one layer's backward workspace comes after the head's buffers are freed, "
        f"never beside them), the allocator's stranded bytes {reserve / GIB:.1f} GiB (the allocator replay's bound "
        f"on {segments} segments, memory/allocator_trace.py stranded_bytes) and "
        f"{gib('cuda_context_and_nccl', 'vllm_context')} of contexts: {update.peak_bytes / GIB:.1f} GiB, "
        f"{(update.peak_bytes - reserve) / GIB:.1f} GiB without the reserve. More nodes do not lower it: EP "
        "stays 8, the token budget is per GPU and the optimizer is on the host, so 1 to 4 nodes price the same. "
        "Against the script's 'tested on 1-4 nodes of 96G H20' this stays open (docs/megatron.md, 'The MoE "
        "example that does not fit'): no measurement of that run is at hand, and a public report of the same "
        "script running out of memory on 8 nodes of 96G H20 (verl-project/verl issue 3364) agrees with the "
        "prediction without saying in which phase, so the row is a prediction, not a validation.")


def section() -> str:
    runs = published_runs()
    return "\n".join([
        SECTION_HEADING, "",
        "Generated by `python benchmarks/megatron_memory.py --write docs/accuracy.md`. The first table holds "
        "planner/memory/megatron.py to Megatron-Core's theoretical memory estimate "
        "(megatron/training/theoretical_memory_usage.py, sequence parallel and selective recompute, the most "
        f"loaded rank, a micro batch of {SEQ} tokens). Weights, fp32 gradients and the distributed optimizer "
        "agree to the precision shown (the estimate leaves out Qwen2.5's QKV biases, a few hundred thousand "
        "parameters); activations agree on the shape the estimate assumes (an ungated MLP, multi-head attention) "
        "and the last column is what rlplan prices for the model itself under verl (SwiGLU's wider fc1 output, "
        "grouped KV heads, and no hidden-dropout masks: verl sets hidden_dropout from the HF config, 0 here, and "
        "dropout with p = 0 saves none): larger, as it should be, never below the estimate. MoE models have no "
        "comparable row: Megatron-Core's estimate splits experts over TP only, rlplan over EP x ETP x PP "
        "(tests/planner/test_memory_megatron.py).", "",
        *estimate_rows(), "",
        "verl's own Megatron examples, imported from tests/data/verl_scripts/ and priced per GPU by the whole "
        "step model (rollout, log-prob passes and update through memory/backend.py's Megatron backend), each at "
        "the verl release of the commit its script was taken from: " + release_reasons() + ".",
        moe_full_example_paragraph(), "",
        *verl_run_rows(), "",
        optimizer_step_paragraph(), "",
        published_runs_paragraph(runs), "",
        *published_run_rows(runs),
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None, help="markdown file whose section 6 to regenerate")
    args = parser.parse_args(argv)
    return print_or_write_section(section(), SECTION_HEADING, args.write)


if __name__ == "__main__":
    sys.exit(main())
