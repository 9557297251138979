"""`rlplan compare` on the public verl runs of tests/data/verl_logs/public: docs/accuracy.md section 4, and the
real runs' rows of the error bands (presets/public_runs_accuracy.toml).

    python benchmarks/public_verl_runs.py                                   # the section, on stdout
    python benchmarks/public_verl_runs.py --write docs/accuracy.md          # regenerate its section 4 in place
    python benchmarks/public_verl_runs.py --write-rows presets/public_runs_accuracy.toml

Runs the code `rlplan compare --json` runs (planner/commands/compare_commands.py, planner/compare.py), in process, on
each run's launch script and log with `--gpu h100-80g --fix rollout.enforce_eager=true --verl-version
0.3.0.post1` (the arguments of tests/planner/test_compare.py `public_compare`).  The one constant fitted on these
runs, profile.allocator_cache_engine_workspaces, is fitted here (the mean of each run's own value) and every run
is reported against the value the other runs give (leave-one-out); those errors are the rows the bands are made
of.  Also the min run with the profile `rlplan calibrate --from-verl-log` fits from its own log, and the
max_num_seqs sensitivity of the memory predictions.  Every number in the section comes from these computations.
Pure planner: no torch.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
from attrs import frozen

from rlplan.planner.calibration import VerlRun, calibrate_from_verl_logs
from rlplan.planner.commands.cli import parse_fixes
from rlplan.planner.commands.compare_commands import load_plan_or_script, read_verl_log
from rlplan.planner.compare import Comparison, MemoryRow, compare_run, steady_steps, version_family
from rlplan.planner.memory import GIB, predict_memory
from rlplan.planner.memory.allocator_report import allocator_report
from rlplan.planner.memory.heads import resolved_loss_head
from rlplan.planner.model_error import AccuracyRow, ErrorBand, allocator_regime
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.steptime import predict_step_time, verl_timing_seconds
from rlplan.planner.verl_log import VerlLog

# benchmarks/ is no package: its shared helpers are imported from beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sections import print_or_write_section, replace_section  # noqa: E402, F401 (the tests read replace_section here)
from steptime_sweeps import PHASE_ERROR_LIMIT  # noqa: E402  (section 5's limit on a phase's error)

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ROOT / "tests" / "data" / "verl_logs" / "public"
SECTION_HEADING = "## 4. Public verl runs: `rlplan compare` on real logs (tests/planner/test_compare.py)"
GPU = "h100-80g"
FIXES = ["rollout.enforce_eager=true"]
# The runs' verl: their logs show actor/entropy_loss (dropped on main by verl PR #1100, 2025-04-17) beside
# actor/pg_clipfrac_lower (added by PR #784, 2025-04-02): main between the two, whose closest release is this tag.
VERL_VERSION = "0.3.0.post1"
ROWS_HEADING = ("# The public verl runs' memory counters beside the planner's prediction, each made with the constants "
                "fitted on the\n# other runs (leave-one-out); planner/model_error.py makes the real-run part of the "
                "error bands from them.\n# Written by benchmarks/public_verl_runs.py --write-rows; do not edit by "
                "hand. MiB = 2**20 bytes; error = predicted / measured - 1.\n")
# The sensitivity pins: the runs' config dumps show max_num_seqs 1024 (verl's default then), and section 3b
# bounds vLLM 0.8.3's sampler profile at 17 bytes per sequence x vocabulary entry (an input here, not a result).
LOGGED_MAX_NUM_SEQS = 1024
VLLM_083_SAMPLER_BYTES = 17.0
TIMING_KEYS = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor", "step")


@frozen
class PublicRun:
    label: str
    script: str
    log: str


RUNS = (
    PublicRun(label="7B recommended", script="qwen2_7b_gsm8k_8gpu_recommended.sh", log="verl_qwen2_7b_recommended.log"),
    PublicRun(label="7B min", script="qwen2_7b_gsm8k_8gpu_min.sh", log="verl_qwen2_7b_min.log"),
    PublicRun(label="0.5B GRPO", script="run_demo_qwen2.5b_grpo_8gpu.sh", log="verl_grpo_qwen2.5b_8gpu.log"),
    PublicRun(label="0.5B PPO", script="run_demo_qwen2.5b_ppo_8gpu.sh", log="verl_ppo_qwen2.5b_8gpu.log"),
)


@frozen
class Compared:
    """One run: its plan as imported (before the run's lengths), its log, and the comparison."""

    run: PublicRun
    plan: Plan
    log: VerlLog
    comparison: Comparison


# --- the computations ----------------------------------------------------------------------------------


def imported_plan(run: PublicRun, extra_fixes: tuple[str, ...] = ()) -> Plan:
    """The run's launch script as `rlplan compare SCRIPT LOG --gpu h100-80g --fix ... --verl-version ...` reads it."""
    plan, _ = load_plan_or_script(str(PUBLIC / run.script), gpu=GPU, gpu_mem=None, host_mem=1024.0, env=[],
                                  fixes=parse_fixes([*FIXES, *extra_fixes]), verl_version=VERL_VERSION)
    return plan


def compare(run: PublicRun, profile: Profile = DEFAULT_PROFILE, extra_fixes: tuple[str, ...] = ()) -> Compared:
    plan = imported_plan(run, extra_fixes)
    log = read_verl_log(str(PUBLIC / run.log))
    return Compared(run=run, plan=plan, log=log,
                    comparison=compare_run(plan, log, profile, version_family(VERL_VERSION)))


# --- the fitted constant, leave-one-out ---------------------------------------------------------------


@frozen
class Fitted:
    """One run's reserved counter as allocator_cache_engine_workspaces moves it (linear: the term is the same in
    every phase), the value that would fit it alone, and its prediction with the other runs' value."""

    run: PublicRun
    measured_gib: float
    without_gib: float  # the prediction with the constant at 0
    workspace_gib: float  # what one unit of the constant adds (the engine's profiled workspace)
    own: float  # the constant that predicts this run exactly
    others: float  # the mean of the other runs' `own`: the value this run is reported against

    @property
    def left_out_gib(self) -> float:
        return self.without_gib + self.others * self.workspace_gib


def fit_constant(runs: list[Compared]) -> list[Fitted]:
    """Each run's own allocator_cache_engine_workspaces and its leave-one-out prediction of the reserved counter."""
    zero = attrs.evolve(DEFAULT_PROFILE, allocator_cache_engine_workspaces=0.0)
    one = attrs.evolve(DEFAULT_PROFILE, allocator_cache_engine_workspaces=1.0)
    parts = []
    for c in runs:

        def reserved(profile: Profile, c: Compared = c) -> float:
            scope = c.comparison.scope
            rows = allocator_report(c.comparison.plan, profile, engine_in_process=scope.engine_in_process,
                                    pool_counted_asleep=scope.pool_counted_asleep)
            return max(r.reserved for r in rows) / GIB

        without, workspace = reserved(zero), reserved(one) - reserved(zero)
        measured = row(c, True).measured_gib
        parts.append((c.run, measured, without, workspace, (measured - without) / workspace if workspace else 0.0))
    fitted = []
    for i, (run, measured, without, workspace, own) in enumerate(parts):
        others = statistics.fmean(p[4] for j, p in enumerate(parts) if j != i)
        fitted.append(Fitted(run=run, measured_gib=measured, without_gib=without, workspace_gib=workspace, own=own,
                             others=others))
    return fitted


def fitted_constant(fitted: list[Fitted]) -> float:
    """The profile's value: the mean of every run's own (rounded as the profile records it)."""
    return round(statistics.fmean(f.own for f in fitted), 2)


def run_rows(runs: list[Compared], fitted: list[Fitted]) -> list[AccuracyRow]:
    """The rows of presets/public_runs_accuracy.toml: each run's allocated counter (no constant fitted on these
    runs moves it) and its reserved counter at the leave-one-out constant."""
    by_run = {f.run: f for f in fitted}
    rows = []
    for c in runs:
        plan, scope = c.comparison.plan, c.comparison.scope
        regime = allocator_regime(scope.engine_in_process,
                                  any(p.expandable for p in allocator_report(plan, DEFAULT_PROFILE)))
        for reserved in (False, True):
            r = row(c, reserved)
            predicted = by_run[c.run].left_out_gib if reserved else r.predicted_gib
            rows.append(AccuracyRow(source="public", model=c.run.label, phase=str(r.predicted_peak_phase),
                                    head=resolved_loss_head(plan), strategy=plan.actor.strategy,
                                    configuration=f"{c.run.script}, verl {VERL_VERSION}", counter=r.counter,
                                    regime=regime, measured_mib=round(r.measured_gib * 1024, 1),
                                    predicted_mib=round(predicted * 1024, 1)))
    return rows


def rows_toml(rows: list[AccuracyRow]) -> str:
    lines = [ROWS_HEADING.rstrip("\n")]
    for r in rows:
        lines += ["[[row]]"] + [f"{key} = {_toml_value(getattr(r, key))}" for key in (
            "source", "model", "phase", "head", "strategy", "configuration", "counter", "regime", "measured_mib",
            "predicted_mib")] + [""]
    return "\n".join(lines)


def _toml_value(value: object) -> str:
    return f"{value}" if isinstance(value, float) else '"' + str(value).replace('"', '\\"') + '"'


def left_out_band(rows: list[AccuracyRow], left_out: AccuracyRow) -> ErrorBand:
    """The band the other runs give for this one's counter, as planner/model_error.py builds it (comparable by
    counter and regime, their 95 % prediction interval, with the twin rows for the allocated counter)."""
    from rlplan.planner import model_error

    real = [r for r in rows if r.model != left_out.model and r.counter == left_out.counter]
    comparable = [r for r in real if r.regime == left_out.regime] or real
    under, over = model_error.real_run_interval([r.error for r in comparable])
    twins = model_error._twin_band(left_out.kind, left_out.head, "fsdp2") if left_out.counter == "allocated" else None
    return ErrorBand(under=max(twins.under if twins else 0.0, under), over=max(twins.over if twins else 0.0, over),
                     rows=0, basis="the other runs", runs=len(comparable), comparable_runs=True,
                     counter=left_out.counter)


def calibrated_profile(runs: list[Compared], name: str) -> Profile:
    """What `rlplan calibrate --from-verl-log LOG... --plan SCRIPT...` fits from these runs."""
    return calibrate_from_verl_logs([VerlRun(plan=c.plan, log=c.log) for c in runs], name=name).profile


def sampler_profile() -> Profile:
    return attrs.evolve(DEFAULT_PROFILE, name="vllm-0.8.3-sampler", vllm_sampler_bytes_per_seq_vocab=VLLM_083_SAMPLER_BYTES)


def predicted_timings(c: Compared, profile: Profile) -> dict[str, float]:
    plan = c.comparison.plan
    return verl_timing_seconds(predict_step_time(plan, predict_memory(plan, profile), profile))


def measured_timings(log: VerlLog) -> dict[str, float]:
    """Median `timing_s/<key>` over the steps `rlplan compare` times (steady, neither validating nor saving)."""
    used = set(steady_steps(log))
    medians: dict[str, float] = {}
    for key in TIMING_KEYS:
        values = [v for s in log.steps if s.step in used and (v := s.get(f"timing_s/{key}")) is not None]
        if values:
            medians[key] = statistics.median(values)
    return medians


def row(c: Compared, reserved: bool) -> MemoryRow:
    key = c.comparison.scope.reserved_key if reserved else c.comparison.scope.allocated_key
    return next(r for r in c.comparison.memory if r.metric == key)


# --- the section ---------------------------------------------------------------------------------------


def _describe(plan: Plan) -> str:
    offload = [what for what, on in (("param", plan.actor.param_offload), ("optimizer", plan.actor.optimizer_offload))
               if on]
    return (f"{plan.algorithm.adv_estimator.upper()}, {' + '.join(offload) + ' offload' if offload else 'no offload'}, "
            f"TP {plan.rollout.tensor_model_parallel_size}, n {plan.rollout.n}, "
            f"util {plan.rollout.gpu_memory_utilization:g}")


def _verdict(r: MemoryRow) -> str:
    if not r.exceeds:
        return "within the band"
    error = r.predicted_gib / r.measured_gib - 1
    return f"OUTSIDE the band: {'over' if error > 0 else 'under'}-predicted by {100 * abs(error):.1f} %"


def _pct(value: float) -> str:
    return f"{100 * value:+.1f} %"


def memory_table(runs: list[Compared], fitted: list[Fitted], rows: list[AccuracyRow]) -> list[str]:
    """Each counter out of sample: the prediction with the constant the other runs give, its error, the band the
    other runs give, and whether the measurement lies inside it; then what `rlplan compare` prints."""
    by_run = {f.run: f for f in fitted}
    lines = ["| run | counter | measured GiB | predicted GiB (fit on the others) | error | predicted peak at | "
             "band from the other runs | inside | `rlplan compare` predicts, verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in runs:
        for reserved in (False, True):
            r = row(c, reserved)
            own = next(x for x in rows if x.model == c.run.label and x.counter == r.counter)
            band = left_out_band(rows, own)
            predicted = by_run[c.run].left_out_gib if reserved else r.predicted_gib
            inside = band.lowest_actual_gib(predicted) <= r.measured_gib <= band.highest_actual_gib(predicted)
            lines.append(f"| {c.run.label} ({_describe(c.plan)}) | {r.counter} | {r.measured_gib:.2f} | "
                         f"{predicted:.2f} | {_pct(predicted / r.measured_gib - 1)} | {r.predicted_peak_phase} | "
                         f"-{100 * band.under:.1f} % / +{100 * band.over:.1f} % | {'yes' if inside else 'NO'} | "
                         f"{r.predicted_gib:.2f}, {_verdict(r)} |")
    return lines


def calibrated_lines(calibrated: Compared) -> list[str]:
    rows = [f"{r.counter} {r.measured_gib:.2f} measured, {r.predicted_gib:.2f} predicted ({_verdict(r)})"
            for r in calibrated.comparison.memory]
    return [f"The min run once more with the profile `rlplan calibrate --from-verl-log` fits from its own log (in "
            f"sample, so no evidence of accuracy: it shows what a site's own log adds): {'; '.join(rows)}.", ""]


def sensitivity_table(runs: list[Compared], pinned: list[Compared], pinned_sampler: list[Compared]) -> list[str]:
    lines = ["| run | imported max_num_seqs | predicted allocated GiB (ratio) | max_num_seqs "
             f"{LOGGED_MAX_NUM_SEQS} | and {VLLM_083_SAMPLER_BYTES:g} sampler bytes |", "|---|---|---|---|---|"]
    for c, p, s in zip(runs, pinned, pinned_sampler, strict=True):
        cells = [f"{r.predicted_gib:.2f} ({r.ratio:.3f})" for r in (row(c, False), row(p, False), row(s, False))]
        lines.append(f"| {c.run.label} | {c.plan.rollout.max_num_seqs} | " + " | ".join(cells) + " |")
    return lines


def time_table(runs: list[Compared]) -> list[str]:
    lines = ["| run | timing_s/ | measured s | predicted s | ratio |", "|---|---|---|---|---|"]
    for c in runs:
        measured = measured_timings(c.log)
        predicted = predicted_timings(c, DEFAULT_PROFILE)
        for key in TIMING_KEYS:
            if key in measured and key in predicted:
                lines.append(f"| {c.run.label} | {key} | {measured[key]:.2f} | {predicted[key]:.2f} | "
                             f"{measured[key] / predicted[key]:.2f} |")
    return lines


def _lengths(c: Compared) -> str:
    data = c.comparison.plan.data
    return f"{c.run.label} {data.expected_prompt_length} + {data.expected_response_length}"


def intro(runs: list[Compared], fitted: list[Fitted]) -> list[str]:
    constant = fitted_constant(fitted)
    return [
        SECTION_HEADING, "",
        "Generated by `python benchmarks/public_verl_runs.py --write docs/accuracy.md`: the code of `rlplan compare "
        "--json` (planner/compare.py), in process, on the logs in tests/data/verl_logs/public (README there: "
        "dingxianzhong/play-verl, PPO on Qwen2-7B-Instruct and GRPO / PPO on Qwen2.5-0.5B-Instruct, GSM8K, "
        f"{_span([float(c.plan.cluster.world_size) for c in runs], 0)}x H100, vLLM 0.8.3, verl main of April 2025 "
        f"with sync in-process vLLM, first {_span([float(c.comparison.lengths.steps) for c in runs], 0)} steps), "
        f"profile `{DEFAULT_PROFILE.name}`. Each script imported with `--gpu {GPU} --fix {' --fix '.join(FIXES)} "
        f"--verl-version {VERL_VERSION}` (the logs show `actor/entropy_loss`, which verl PR #1100 dropped on "
        "2025-04-17, beside `actor/pg_clipfrac_lower`, which PR #784 added on 2025-04-02: this release's code; "
        "the config dump shows eager mode), priced at the run's mean lengths, rounded up (prompt + response "
        "tokens: " + "; ".join(_lengths(c) for c in runs) + "). Scope of the memory figures (docs/verl-compare.md): "
        f"verl {runs[0].comparison.scope.versions} reads `torch.cuda.max_memory_allocated()` / "
        "`max_memory_reserved()` of rank 0's worker process after `update_actor`, never reset, so each is the "
        "process peak over every phase since start; both include the in-process vLLM's weights and KV pool "
        "(counted even while asleep) and exclude the CUDA context and NCCL.", "",
        "The allocated prediction is the largest over phases of the tensors torch holds (planner/memory/"
        "allocator_report.py); no constant in it is fitted on these runs. The reserved prediction adds what the "
        "caching allocator keeps: the replay of the step's allocations through torch's documented allocator "
        "policy (planner/memory/allocator.py, allocator_trace.py: 512 B rounding, 2 MiB small and 20 MiB large "
        "segments, best fit and splitting, verl's empty_cache calls per version, expandable segments where "
        "verl or PYTORCH_CUDA_ALLOC_CONF turn them on) plus one fitted term, "
        "`allocator_cache_engine_workspaces` engine workspaces for a vLLM engine in the trainer's process on "
        "fixed segments (the regime of these runs). Fitted here: each run's own value is "
        + ", ".join(f"{f.run.label} {f.own:.2f}" for f in fitted) + f"; the profile keeps their mean, {constant:.2f}. "
        "Each run is reported with the mean of the other three (leave-one-out), and its band is the one the other "
        "runs give (with the twin rows of docs/accuracy.md sections 1-2 for the allocated counter): these rows are "
        "presets/public_runs_accuracy.toml, what planner/model_error.py makes the real-run bands of.", "",
    ]


def _span(values: list[float], digits: int = 1) -> str:
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def summary_lines(runs: list[Compared], fitted: list[Fitted]) -> list[str]:
    reserved = [f.left_out_gib / f.measured_gib - 1 for f in fitted]
    allocated = [row(c, False).predicted_gib / row(c, False).measured_gib - 1 for c in runs]
    within = sum(abs(e) <= 0.15 for e in reserved)
    return [f"Out of sample, the reserved counter is predicted within 15 % on {within} of {len(reserved)} runs "
            f"({_pct(min(reserved))} to {_pct(max(reserved))}), the allocated one at {_pct(min(allocated))} to "
            f"{_pct(max(allocated))}.", ""]


def sensitivity_lines(runs: list[Compared], pinned: list[Compared], pinned_sampler: list[Compared]) -> list[str]:
    return [
        f"Sensitivity to what the runs really had: their config dumps show `max_num_seqs: {LOGGED_MAX_NUM_SEQS}` "
        "(verl's default then; `import verl` fills verl 0.9's). Pinned as well (`--fix "
        f"rollout.max_num_seqs={LOGGED_MAX_NUM_SEQS}`), the planner's sampler term, fitted to vLLM 0.11's V1 sampler "
        f"({DEFAULT_PROFILE.vllm_sampler_bytes_per_seq_vocab:g} bytes per sequence x vocabulary entry), reserves "
        "more of the engine's budget for the profile run and leaves a smaller pool; the last column also takes "
        f"section 3b's bound for vLLM 0.8.3 (a profile with `vllm_sampler_bytes_per_seq_vocab = "
        f"{VLLM_083_SAMPLER_BYTES:g}`).", "",
        *sensitivity_table(runs, pinned, pinned_sampler), "",
    ]


def card_lines(recommended: Compared) -> list[str]:
    card = recommended.plan.cluster.gpu.memory_gib
    allocated, reserved = row(recommended, False), row(recommended, True)
    over = [f"{name} {r.measured_gib:.1f} GiB" for name, r in (("reserved", reserved), ("allocated", allocated))
            if r.measured_gib > card]
    if not over:
        return []
    return [
        f"The recommended run's {' and '.join(over)} exceed the {card:.1f} GiB of an H100: with vLLM >= 0.7.3 sleep "
        "mode the sleeping pool's blocks stay counted although their physical memory is released, so these figures "
        "are not what the card held, and the comparison adds the pool to the trainer phases for the same reason.", "",
    ]


def optimizer_gap_lines(recommended: Compared) -> list[str]:
    """The allocated counter's jump after step 1 beside the actor's Adam state, which torch creates at the first
    optimizer step."""
    series = recommended.log.series(recommended.comparison.scope.allocated_key)
    first = series[0][1]
    later = max(value for _, value in series[1:])
    r = row(recommended, False)
    report = predict_memory(recommended.comparison.plan, DEFAULT_PROFILE)
    state = report.phase(Phase.ACTOR_UPDATE).bytes_of("actor_optimizer_state") / GIB
    without = r.predicted_gib - state
    return [
        f"Step 1 against later steps (7B recommended, allocated): at step {series[0][0]} the counter reads "
        f"{first:.2f} GiB, from step {series[1][0]} on {later:.2f}, a jump of {later - first:.1f} GiB: the actor's "
        f"Adam state, {state:.2f} GiB per GPU. torch creates a parameter's exp_avg and exp_avg_sq at its first "
        "`step()` (torch/optim/adam.py `_init_group`), so step 1's forward and backward ran without the state and "
        "only later steps peak with it (verl 0.3's dp_actor.update_policy ends with `zero_grad()`, so the gradients "
        f"are not what stays). Without the state the prediction is {without:.2f} GiB ({first - without:+.1f} "
        f"against step 1), with it {r.predicted_gib:.2f} ({later - r.predicted_gib:+.1f} against the later steps): "
        "the same gap at both, which the planner does not explain. The replay creates each optimizer's state at "
        "its first step too: the state then sits in segments the freed activations left, and the next step's "
        "activations take new ones (most of this run's replayed cache above).", "",
    ]


def allocator_lines(runs: list[Compared], fitted: list[Fitted]) -> list[str]:
    """The cache, measured and predicted, and how much of it the replay explains before the fitted term."""
    cells = []
    for c, f in zip(runs, fitted, strict=True):
        allocated = row(c, False)
        measured = f.measured_gib - allocated.measured_gib
        replay = f.without_gib - allocated.predicted_gib
        cells.append(f"{c.run.label} {measured:.1f} GiB measured, {replay:.1f} from the replay, "
                     f"{f.others * f.workspace_gib:.1f} from the fitted term")
    return [f"The cache (reserved minus allocated): {'; '.join(cells)}. The replay's part is what the trainer's "
            "micro batches of varying length leave in segments sized for the longest one (a larger micro batch "
            "cannot use a smaller one's segments, and segments never merge) and what the optimizer's state, "
            "created at the first step in segments the freed activations left, makes the next step's activations "
            "take anew; the fitted term stands for what the "
            "in-process engine's decode steps and the head's tensors leave that the replay does not list one by "
            "one. The fitted term does not apply on expandable segments (verl >= 0.6's trainer phases) or with "
            "the engine in its own process (verl >= 0.7): no public run of those regimes was found, so their "
            "bands say they have no comparable evidence.", ""]


def time_summary(runs: list[Compared]) -> list[str]:
    """How many phases lie within section 5's limit, and the farthest one."""
    ratios = [(measured / predicted, c.run.label, key) for c in runs
              for key, measured in measured_timings(c.log).items()
              if (predicted := predicted_timings(c, DEFAULT_PROFILE).get(key))]
    within = sum(abs(1 / ratio - 1) <= PHASE_ERROR_LIMIT for ratio, _, _ in ratios)
    ratio, label, key = max(ratios, key=lambda item: abs(math.log(item[0])))
    return [f"{within} of {len(ratios)} phases are predicted within {PHASE_ERROR_LIMIT:.0%} of the measurement "
            f"(section 5's limit); the farthest is {label} `{key}`, measured {ratio:.2f}x the prediction.", ""]


def time_lines(runs: list[Compared]) -> list[str]:
    small = [c for c in runs if c.run.label.startswith("0.5B")]
    gen_ratios = [measured_timings(c.log)["gen"] / predicted_timings(c, DEFAULT_PROFILE)["gen"] for c in small]
    forecasts = [f"{c.run.label}: {c.comparison.forecast.message()}" for c in runs]
    return [
        "Time per phase (seconds, the median over the steps `rlplan compare` times: all but the first, without the "
        "validating or checkpointing ones; verl's `timing_s/*` keys as "
        "planner/steptime.py `verl_timing_seconds` books the phases: `gen` is the rollout + the weight sync, which "
        "this verl times inside it, `update_actor` the update + the actor's offload traffic, `step` every predicted "
        "phase; reward and advantages are not priced). The step-time model and its constants: docs/steptime.md.", "",
        *time_table(runs), "",
        *time_summary(runs),
        f"These rows price each script as `rlplan compare` imports it at verl {VERL_VERSION}, with rlplan's key "
        "table's defaults for the keys it leaves out where no version behaviour says otherwise. The logs' own config "
        "dumps differ where it matters for time (critic.model.use_remove_padding "
        "False in the PPO runs, the actor's too in the 0.5B PPO run, max_num_seqs 1024): section 5a prices the "
        "four logs with those pins (benchmarks/data/steptime_logs.toml), each with constants fitted without it.",
        "",
        f"On the 0.5B runs `gen` measures {_span(gen_ratios)}x the prediction: a 0.5B model decoding"
        " in eager mode (these runs' `enforce_eager: True`) is bound by per-step launch and sampling "
        "overheads, not by the HBM reads the roofline prices.", "",
        "Length forecasts (`rlplan compare`'s trend of response_length/mean over each log's "
        f"{_span([float(c.comparison.lengths.steps) for c in runs], 0)} steps): "
        + "; ".join(forecasts) + ".", "",
    ]


def render_section(runs: list[Compared], fitted: list[Fitted], calibrated: Compared, pinned: list[Compared],
                   pinned_sampler: list[Compared]) -> str:
    by_label = {c.run.label: c for c in runs}
    recommended = by_label["7B recommended"]
    rows = run_rows(runs, fitted)
    lines = [*intro(runs, fitted), *memory_table(runs, fitted, rows), "", *summary_lines(runs, fitted),
             *allocator_lines(runs, fitted), *calibrated_lines(calibrated),
             *sensitivity_lines(runs, pinned, pinned_sampler), *card_lines(recommended),
             *optimizer_gap_lines(recommended), *time_lines(runs)]
    return "\n".join(lines)


def compute(on_each: Callable[[str], None] = lambda _: None) -> tuple[list[Compared], list[Fitted]]:
    runs = [compare(run) for run in RUNS]
    on_each("compared the four runs")
    return runs, fit_constant(runs)


def compute_section(on_each: Callable[[str], None] = lambda _: None) -> str:
    runs, fitted = compute(on_each)
    by_label = {c.run.label: c for c in runs}
    low_only = calibrated_profile([by_label["7B min"]], name="min")
    calibrated = compare(by_label["7B min"].run, low_only)
    pin = (f"rollout.max_num_seqs={LOGGED_MAX_NUM_SEQS}",)
    pinned = [compare(run, extra_fixes=pin) for run in RUNS]
    pinned_sampler = [compare(run, sampler_profile(), extra_fixes=pin) for run in RUNS]
    on_each("calibrated and pinned")
    return render_section(runs, fitted, calibrated, pinned, pinned_sampler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None, help="markdown file whose section 4 to regenerate")
    parser.add_argument("--write-rows", type=Path, default=None,
                        help="the real runs' rows of the error bands (presets/public_runs_accuracy.toml)")
    args = parser.parse_args(argv)
    if args.write_rows is not None:
        runs, fitted = compute()
        args.write_rows.write_text(rows_toml(run_rows(runs, fitted)), encoding="utf-8")
        print(f"wrote {args.write_rows}; allocator_cache_engine_workspaces = {fitted_constant(fitted):.2f}")
        if args.write is None:
            return 0
    return print_or_write_section(compute_section(), SECTION_HEADING, args.write)


if __name__ == "__main__":
    sys.exit(main())
