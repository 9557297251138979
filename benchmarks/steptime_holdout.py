"""Fit the step-time constants on some published runs and logs, and report the error on the others.

    python benchmarks/steptime_holdout.py                               # every protocol's section, on stdout
    python benchmarks/steptime_holdout.py --write docs/accuracy.md      # regenerate them in place, and the
                                                                        # bands of presets/steptime_accuracy.toml
    python benchmarks/steptime_holdout.py --protocol fsdp --summary     # the headline figures only

Backend-agnostic.  A *case* is one measured run: its plan as imported (at the run's mean lengths) and its
measured seconds per verl `timing_s/<key>`, in a *group*: one published sweep or one log.  A *dataset* loads
cases (DATASETS below: published sweeps of benchmarks/data/, public logs of steptime_logs.toml); a
*protocol* (PROTOCOLS) names the datasets one backend is judged on, the profile keys fitted and the section
of docs/accuracy.md it writes.  A second backend adds its datasets and a protocol; nothing else changes.

Leave one group out: for each group, `calibration.fit_step_time` fits the protocol's keys to every case of
the *other* groups (from the built-in profile), and the left-out group is priced with that profile: out of
sample.  In sample: one fit to every case, every case priced (what the built-in constants were).  Reported,
both ways: step times within PHASE_ERROR_LIMIT, phase times within it and within LOG_PHASE_FACTOR (the logs'
target), and per sweep the rank correlation of its step times.  Pure planner: no torch.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
from attrs import frozen

from rlplan.planner.calibration import (
    FITTED_TIMINGS,
    STEP_TIME_CONSTANTS,
    RunTiming,
    VerlRun,
    fit_step_time,
    verl_run_timing,
)
from rlplan.planner.compare import plan_at_run_lengths, run_lengths, steady_steps
from rlplan.planner.knobs import apply_knobs, parse_pin
from rlplan.planner.memory import predict_memory
from rlplan.planner.plan import Plan
from rlplan.planner.presets import resolve_gpu
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.steptime import predict_step_time, verl_timing_seconds
from rlplan.planner.verl_import import import_verl_script
from rlplan.planner.verl_log import parse_verl_log

# benchmarks/ is no package: its shared helpers are imported from beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import steptime_sweeps  # noqa: E402
from _sections import print_or_write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "benchmarks" / "data" / "steptime_logs.toml"
PHASE_ERROR_LIMIT = steptime_sweeps.PHASE_ERROR_LIMIT  # a step or phase "within 25 %"
LOG_PHASE_FACTOR = 2.0  # a log's phase "within 2x"
RANK_TARGET = steptime_sweeps.RANK_TARGET
# The keys a case's error is reported on: the phases the fit compares, and the step.
REPORTED = (*FITTED_TIMINGS, "step")


@frozen(kw_only=True)
class Case:
    """One measured run: its plan (at its mean lengths) and its seconds per verl timing key."""

    dataset: str
    group: str  # the hold-out unit: one sweep, or one log
    label: str
    kind: str  # "sweep" (a publisher's table) or "log" (a run's own timing_s lines)
    plan: Plan
    measured: dict[str, float]
    # Measured keys left out of the comparison: they sum an unpublished number of generation rounds
    # (steptime_sweeps.Run.over_rounds).
    over_rounds: tuple[str, ...] = ()

    def timing(self) -> RunTiming:
        return RunTiming(label=f"{self.group}: {self.label}", plan=self.plan,
                         measured_seconds={k: v for k, v in self.measured.items() if k in FITTED_TIMINGS})


@frozen(kw_only=True)
class Priced:
    """A case priced with one profile, and whether that profile was fitted without it."""

    case: Case
    predicted: dict[str, float]
    out_of_sample: bool

    def error(self, key: str) -> float | None:
        """predicted / measured - 1 of one timing key, None when either side lacks it."""
        measured, predicted = self.case.measured.get(key), self.predicted.get(key)
        if not measured or not predicted:
            return None
        return predicted / measured - 1


# --- datasets ------------------------------------------------------------------------------------------


def sweep_cases(path: Path, dataset: str) -> list[Case]:
    """Every run of a published-sweep TOML (steptime_sweeps.py's format), one group per sweep."""
    sweeps = steptime_sweeps.load_sweeps(path)
    return [Case(dataset=dataset, group=run.sweep, label=run.label, kind="sweep", plan=run.plan,
                 measured=dict(run.measured), over_rounds=tuple(run.over_rounds))
            for run in steptime_sweeps.all_runs(sweeps)]


def _log_plan(entry: Mapping) -> Plan:
    """The log's launch script as `rlplan import verl` reads it, on the stated release, with the pins its config
    dump shows."""
    verl, vllm = (list(entry.get("versions", [])) + [None, None])[:2]
    imported = import_verl_script((ROOT / entry["script"]).read_text(encoding="utf-8"),
                                  gpu=resolve_gpu(entry["gpu"]), host_memory_gib=2048.0, env={"HOME": "/home"},
                                  local_config_reader=lambda path: None, versions=(verl, vllm, None))
    fixes = dict(parse_pin(*fix.split("=", 1)) for fix in entry.get("fixes", []))
    return apply_knobs(imported.plan, fixes)


def log_cases(path: Path = LOGS, dataset: str = "public-logs") -> list[Case]:
    """Every log of steptime_logs.toml, one group each, priced at the run's mean lengths."""
    cases = []
    for entry in tomllib.loads(path.read_text(encoding="utf-8"))["log"]:
        log = parse_verl_log((ROOT / entry["log"]).read_text(encoding="utf-8", errors="replace"), source=entry["log"])
        plan = plan_at_run_lengths(_log_plan(entry), run_lengths(log))
        timing = verl_run_timing(VerlRun(plan=plan, log=log))
        measured = dict(timing.measured_seconds) if timing else {}
        used = set(steady_steps(log))
        steps = [v for step, v in log.series("timing_s/step") if step in used and math.isfinite(v)]
        if steps:
            measured["step"] = statistics.median(steps)
        cases.append(Case(dataset=dataset, group=entry["name"], label=entry["name"], kind="log", plan=plan,
                          measured=measured))
    return cases


# name -> loader.  A new backend's published runs are one more entry (and a protocol below that names it).
DATASETS: dict[str, Callable[[], list[Case]]] = {
    "fsdp-sweeps": lambda: sweep_cases(steptime_sweeps.DATA, "fsdp-sweeps"),
    "megatron-sweeps": lambda: sweep_cases(steptime_sweeps.MEGATRON_DATA, "megatron-sweeps"),
    "public-logs": log_cases,
}


@frozen(kw_only=True)
class Protocol:
    """One backend's judgement: the datasets it is fitted and held out on, the keys fitted, its section."""

    name: str
    title: str
    datasets: tuple[str, ...]
    keys: tuple[str, ...]
    heading: str
    # How its runs are held out: "group" (leave one group out: fitted on the others), or "built-in" (priced with
    # the built-in profile, whose step-time constants are another protocol's fit on other runs).
    held_out_by: str = "group"


PROTOCOLS: dict[str, Protocol] = {
    "fsdp": Protocol(
        name="fsdp", title="verl's FSDP workers", datasets=("fsdp-sweeps", "public-logs"),
        keys=STEP_TIME_CONSTANTS,
        heading="## 5a. Step time out of sample: fitted on some runs, priced on the others"),
    # verl's Megatron workers (issue 39): every published Megatron run priced with the built-in constants, the fsdp
    # protocol's fit to FSDP sweeps and logs, which reads no Megatron run: out of sample. The trainer constants
    # refitted to the Megatron runs themselves are the in-sample comparison (what a Megatron fit would gain).
    "megatron": Protocol(
        name="megatron", title="verl's Megatron workers", datasets=("megatron-sweeps",),
        keys=("training_mfu", "training_mfu_light_gpu", "micro_batch_seconds_per_layer"), held_out_by="built-in",
        heading="## 5b. Megatron step time out of sample: priced with the constants fitted on FSDP runs"),
}


# --- the protocol --------------------------------------------------------------------------------------


def price(cases: Sequence[Case], profile: Profile, out_of_sample: bool) -> list[Priced]:
    priced = []
    for case in cases:
        memory = predict_memory(case.plan, profile)
        priced.append(Priced(case=case, out_of_sample=out_of_sample,
                             predicted=verl_timing_seconds(predict_step_time(case.plan, memory, profile))))
    return priced


# The values every fit of the protocol starts from and is drawn back to (the ridge prior's centre), so that no
# left-out group's own numbers reach its fold through the built-in profile (whose step-time constants are this
# protocol's in-sample fit). The decode, MFU and micro-batch keys keep the values fitted to the three published
# sweeps before issue 40 (commit fbbbd51, docs/steptime.md; the logs had no part in them); the fixed costs
# start at estimates made before any fit, from verl's code and this CPU (benchmarks/host_costs.py).
PROTOCOL_BASE: dict[str, float] = {
    "decode_step_floor_s": 3.4e-3, "decode_eager_seconds_per_layer": 0.68e-3, "decode_seconds_per_sequence": 27e-6,
    "tp_allreduce_latency_us": 135.0, "decode_mfu": 0.17, "response_length_sigma": 0.42, "training_mfu": 0.42,
    "training_mfu_light_gpu": 0.74, "micro_batch_seconds_per_layer": 0.48e-3,
    # a Ray call to every rank and its gather, the sharding manager, empty_cache: tens of milliseconds
    "worker_call_seconds": 0.05,
    # torch.save, the object store, torch.load and torch.cat: ~5 copies at this CPU's 4-6 GB/s clone rate
    "dataproto_gbps": 1.0,
    # CUDA copies to and from pageable memory: about a quarter of pinned PCIe gen5
    "pageable_copy_gbps": 12.0,
    # a clip-grad-norm sync and per-tensor launches per optimizer step: about a millisecond per layer
    "optimizer_step_seconds_per_layer": 1.0e-3,
    # a Python loop per response: decode plus a regex, about 0.1 ms
    "reward_seconds_per_sequence": 1.0e-4,
    # host_costs.py's GAE here (85 us per position, 170 ns per token), at a host ~3x faster
    "gae_seconds_per_position": 3.0e-5, "gae_seconds_per_token": 6.0e-8,
    # a Python loop over the responses by prompt: tens of microseconds each
    "grouped_advantage_seconds_per_sequence": 3.0e-5,
    # unmapping and remapping the engine's budget chunk by chunk: ~1 s for a 60 GiB budget
    "engine_wake_sleep_seconds_per_gib": 0.016,
}


def protocol_base(protocol: Protocol) -> Profile:
    """Where a protocol's fits start: the built-in profile (a `built-in` protocol's own out-of-sample profile),
    else with its keys at PROTOCOL_BASE's values."""
    if protocol.held_out_by == "built-in":
        return DEFAULT_PROFILE
    return attrs.evolve(DEFAULT_PROFILE, name="protocol-base",
                        **{key: PROTOCOL_BASE[key] for key in protocol.keys if key in PROTOCOL_BASE})


# The ridge prior every fit of the protocol uses (calibration.fit_step_time's prior_weight): a constant moves
# from its sourced value only as far as the runs insist.
PRIOR_WEIGHT = 0.005


def fitted_profile(cases: Sequence[Case], keys: Sequence[str], base: Profile, name: str,
                   prior_weight: float = PRIOR_WEIGHT) -> Profile:
    return fit_step_time([case.timing() for case in cases], base, keys=keys, name=name,
                         prior_weight=prior_weight).profile


def in_sample(cases: Sequence[Case], keys: Sequence[str], base: Profile = DEFAULT_PROFILE,
              prior_weight: float = PRIOR_WEIGHT) -> list[Priced]:
    """One fit to every case, every case priced with it."""
    return price(cases, fitted_profile(cases, keys, base, "in-sample", prior_weight), out_of_sample=False)


def groups(cases: Sequence[Case]) -> list[str]:
    return list(dict.fromkeys(case.group for case in cases))


def leave_one_group_out(cases: Sequence[Case], keys: Sequence[str], base: Profile = DEFAULT_PROFILE,
                        on_each: Callable[[str], None] = lambda _: None,
                        prior_weight: float = PRIOR_WEIGHT) -> list[Priced]:
    """For each group: fit to every other group's cases, price this group's with that profile."""
    priced: list[Priced] = []
    for group in groups(cases):
        others = [case for case in cases if case.group != group]
        profile = fitted_profile(others, keys, base, f"without {group}", prior_weight)
        priced += price([case for case in cases if case.group == group], profile, out_of_sample=True)
        on_each(group)
    return priced


# --- the figures ---------------------------------------------------------------------------------------


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    return steptime_sweeps.spearman(list(xs), list(ys))


@frozen(kw_only=True)
class Summary:
    steps_within: int
    steps: int
    phases_within: int
    phases: int
    log_phases_within_factor: int
    log_phases: int
    ranks: dict[str, float]  # sweep -> Spearman of its step times

    def line(self) -> str:
        ranks = ", ".join(f"{name} {rho:+.2f}" for name, rho in self.ranks.items())
        return (f"{self.steps_within} of {self.steps} step times within {PHASE_ERROR_LIMIT:.0%}; "
                f"{self.phases_within} of {self.phases} phase times within {PHASE_ERROR_LIMIT:.0%}; "
                f"on the logs {self.log_phases_within_factor} of {self.log_phases} phase times within "
                f"{LOG_PHASE_FACTOR:g}x; rank correlation per sweep {ranks or 'none'}")


def summarize(priced: Sequence[Priced]) -> Summary:
    steps = [p.error("step") for p in priced]
    phases = [(p, e) for p in priced for key in FITTED_TIMINGS if (e := p.error(key)) is not None]
    log_phases = [e for p, e in phases if p.case.kind == "log"]
    ranks = {}
    for group in groups([p.case for p in priced]):
        members = [p for p in priced if p.case.group == group and p.case.kind == "sweep"
                   and p.error("step") is not None]
        if len(members) >= 3:
            ranks[group] = spearman([p.predicted["step"] for p in members], [p.case.measured["step"] for p in members])
    return Summary(
        steps_within=sum(abs(e) <= PHASE_ERROR_LIMIT for e in steps if e is not None),
        steps=sum(e is not None for e in steps),
        phases_within=sum(abs(e) <= PHASE_ERROR_LIMIT for _, e in phases), phases=len(phases),
        log_phases_within_factor=sum(abs(math.log1p(e)) <= math.log(LOG_PHASE_FACTOR) for e in log_phases),
        log_phases=len(log_phases), ranks=ranks)


def _cell(p: Priced, key: str) -> str:
    measured, predicted = p.case.measured.get(key), p.predicted.get(key)
    if measured is None:
        return "-" if predicted is None else f"- / {predicted:.3g}"
    error = p.error(key)
    return f"{measured:.3g} / {predicted or 0.0:.3g} ({error:+.0%})" if error is not None else f"{measured:.3g} / -"


def table(priced: Sequence[Priced]) -> list[str]:
    keys = [key for key in REPORTED if any(key in p.case.measured for p in priced)]
    lines = ["| group | run | " + " | ".join(f"{key} s measured / predicted (error)" for key in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for p in priced:
        label = "" if p.case.label == p.case.group else p.case.label
        lines.append(f"| {p.case.group} | {label} | " + " | ".join(_cell(p, key) for key in keys) + " |")
    return lines


def error_ranges(priced: Sequence[Priced]) -> dict[str, tuple[float, float, int]]:
    """Per timing key: the largest under- and over-prediction (as fractions >= 0) and how many cases back it."""
    ranges: dict[str, tuple[float, float, int]] = {}
    for key in REPORTED:
        errors = [e for p in priced if (e := p.error(key)) is not None]
        if errors:
            ranges[key] = (max(0.0, -min(errors)), max(0.0, max(errors)), len(errors))
    return ranges


def _held_out_text(protocol: Protocol) -> str:
    if protocol.held_out_by == "built-in":
        return ("**Out of sample**: every run priced with the built-in step-time constants, which the `fsdp` "
                "protocol's fit sets from FSDP sweeps and logs alone (section 5a): no run of this section reaches "
                "them; the per-GPU-class MFUs (`training_mfu` for FLOP-dense GPUs, `training_mfu_light_gpu` for the "
                "H20 class) are those FSDP fits'.")
    return (f"**Out of sample** (leave one group out): for each group, the constants {', '.join(f'`{k}`' for k in protocol.keys)} "
            "are fitted (`calibration.fit_step_time`, from the built-in values) to every other group's runs, and that "
            "group is priced with them.")


def _per_key_line(priced: Sequence[Priced]) -> str:
    cells = []
    for key in REPORTED:
        errors = [e for p in priced if (e := p.error(key)) is not None]
        if errors:
            cells.append(f"{key} {sum(abs(e) <= PHASE_ERROR_LIMIT for e in errors)} of {len(errors)}")
    return ", ".join(cells)


def _rounds_text(cases: Sequence[Case]) -> str:
    """Which measured keys are left out because they sum several generation rounds, and where."""
    summed = [case for case in cases if case.over_rounds]
    if not summed:
        return ""
    keys = ", ".join(f"`{key}`" for key in dict.fromkeys(k for case in summed for k in case.over_rounds))
    return (f" Not compared: {keys} of {len(summed)} runs ({', '.join(groups(summed))}), which sum an unpublished "
            "number of generation rounds (recipe.dapo's dynamic sampling at a generation batch of the train batch; "
            "section 5 gives the source).")


def render_section(protocol: Protocol, cases: Sequence[Case], held: Sequence[Priced],
                   fitted: Sequence[Priced]) -> str:
    out, ins = summarize(held), summarize(fitted)
    datasets = ", ".join(f"`{name}`" for name in protocol.datasets)
    lines = [
        protocol.heading, "",
        f"Generated by `python benchmarks/steptime_holdout.py --write docs/accuracy.md` (protocol `{protocol.name}`, "
        f"{protocol.title}; datasets {datasets}: {len(cases)} runs in {len(groups(cases))} groups, each published "
        f"sweep one group and each log one). {_held_out_text(protocol)} **In sample**: one fit of "
        f"{', '.join(f'`{k}`' for k in protocol.keys)} to every run. A step time's error includes what rlplan does "
        f"not price (validation and checkpoint steps are left out of the medians).{_rounds_text(cases)}", "",
        f"- Out of sample: {out.line()}.",
        f"- Out of sample, per timing key within {PHASE_ERROR_LIMIT:.0%}: {_per_key_line(held)}.",
        f"- In sample: {ins.line()}.", "",
        "Out of sample, run by run (seconds measured / predicted, error = predicted / measured - 1):", "",
        *table(held), "",
        "The error ranges out of sample, per verl timing key: the bands `compare` and `solve --top` print beside "
        f"each phase's seconds (written to presets/{BANDS.name}, read by planner/steptime/bands.py):", "",
        "| timing key | largest under-prediction | largest over-prediction | runs |", "|---|---|---|---|",
        *[f"| {key} | -{under:.0%} | +{over:.0%} | {count} |" for key, (under, over, count) in
          error_ranges(held).items()], "",
    ]
    return "\n".join(lines)


BANDS = ROOT / "presets" / "steptime_accuracy.toml"
BANDS_HEADER = """\
# The step-time model's error out of sample, per backend protocol and verl timing key: the largest under- and
# over-prediction (predicted / measured - 1) of the runs whose sweep or log was left out of the fit, and how many
# runs back it. Generated by `python benchmarks/steptime_holdout.py --write docs/accuracy.md` (section 5a);
# read by planner/steptime/bands.py for the bands `compare` and `solve --top` print. Do not edit by hand.
"""


def write_bands(path: Path, protocol: Protocol, held: Sequence[Priced]) -> None:
    """The protocol's table of `path` replaced by its out-of-sample error ranges; other protocols' kept."""
    import tomli_w

    tables = tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    tables[protocol.name] = {key: {"under": round(under, 4), "over": round(over, 4), "runs": count}
                             for key, (under, over, count) in error_ranges(held).items()}
    path.write_text(BANDS_HEADER + tomli_w.dumps(tables), encoding="utf-8")


def run_protocol(protocol: Protocol, on_each: Callable[[str], None] = lambda _: None,
                 prior_weight: float = PRIOR_WEIGHT) -> tuple[list[Case], list[Priced], list[Priced]]:
    cases = [case for name in protocol.datasets for case in DATASETS[name]()]
    base = protocol_base(protocol)
    if protocol.held_out_by == "built-in":
        held = price(cases, DEFAULT_PROFILE, out_of_sample=True)
    else:
        held = leave_one_group_out(cases, protocol.keys, base, on_each=on_each, prior_weight=prior_weight)
    return cases, held, in_sample(cases, protocol.keys, base, prior_weight=prior_weight)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), action="append",
                        help="the backend's protocol (repeatable; default: every one)")
    parser.add_argument("--write", type=Path, default=None, help="markdown file whose protocol sections to regenerate")
    parser.add_argument("--summary", action="store_true", help="print the headline figures only")
    parser.add_argument("--fit", action="store_true",
                        help="print the in-sample fit's constants (what the built-in profile holds), nothing else")
    parser.add_argument("--prior-weight", type=float, default=PRIOR_WEIGHT,
                        help=f"the fits' ridge prior towards the built-in constants (default {PRIOR_WEIGHT})")
    args = parser.parse_args(argv)
    for name in args.protocol or list(PROTOCOLS):
        protocol = PROTOCOLS[name]
        if args.fit:
            cases = [case for dataset in protocol.datasets for case in DATASETS[dataset]()]
            fitted = fitted_profile(cases, protocol.keys, protocol_base(protocol), "in-sample", args.prior_weight)
            print(f"# {name}: fitted to {len(cases)} runs from the protocol's base (PROTOCOL_BASE)")
            print("\n".join(f"{key} = {float(getattr(fitted, key)):.3g}" for key in protocol.keys))
            continue
        cases, held, fitted = run_protocol(protocol, lambda group: print(f"held out: {group}", file=sys.stderr),
                                           args.prior_weight)
        if args.summary:
            print(f"{name}: out of sample: {summarize(held).line()}")
            print(f"{name}: in sample: {summarize(fitted).line()}")
            continue
        print_or_write_section(render_section(protocol, cases, held, fitted), protocol.heading, args.write)
        if args.write is not None:
            write_bands(BANDS, protocol, held)
    return 0


if __name__ == "__main__":
    sys.exit(main())
