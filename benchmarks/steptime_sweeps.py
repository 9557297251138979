"""Rank published verl configuration sweeps with rlplan's step-time model (planner/steptime.py).

    python benchmarks/steptime_sweeps.py                      # the tables, on stdout
    python benchmarks/steptime_sweeps.py --write docs/accuracy.md   # regenerate its section 5 in place

Each run of benchmarks/data/steptime_sweeps.toml is imported from its Hydra overrides (as `rlplan import
verl` reads a launch script), priced at the run's published mean lengths, and compared phase by phase
with its measured `timing_s/*` seconds.  Per sweep: Spearman's rank correlation of predicted against
measured step times, and the error of each phase, with the built-in profile: in sample, since its constants
were fitted to these runs (and the public logs) by benchmarks/steptime_holdout.py, which reports the same
runs out of sample (docs/accuracy.md section 5a) and prints the fit (`--fit`).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from attrs import frozen

from rlplan.planner.knobs import apply_knobs
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import predict_memory
from rlplan.planner.plan import Plan
from rlplan.planner.presets import resolve_gpu
from rlplan.planner.profile import DEFAULT_PROFILE, Profile, load_profile_toml
from rlplan.planner.steptime import predict_step_time, verl_timing_seconds
from rlplan.planner.steptime.rates import Rates
from rlplan.planner.steptime.rollout import rollout_seconds
from rlplan.planner.verl_import import import_verl_script

# benchmarks/ is no package: its shared helpers are imported from beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sections import print_or_write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "steptime_sweeps.toml"
# verl's Megatron runs: priced by the Megatron step-time backend, never part of `--fit` (out of sample).
MEGATRON_DATA = ROOT / "benchmarks" / "data" / "steptime_sweeps_megatron.toml"
SECTION_HEADING = "## 5. Step time against published verl sweeps"
# The phases each table shows, in verl's timing keys.
SHOWN = ("gen", "old_log_prob", "update_actor", "step")
PHASE_ERROR_LIMIT = 0.25
RANK_TARGET = 0.8


@frozen(kw_only=True)
class Run:
    sweep: str
    label: str
    plan: Plan
    measured: dict[str, float]
    # Measured keys that sum an unpublished number of generation rounds (a sweep's `summed_over_rounds`: recipe.dapo's
    # dynamic sampling regenerates until enough groups are kept), shown beside one round's prediction, never compared.
    over_rounds: dict[str, float] = {}


def load_sweeps(path: Path = DATA) -> dict[str, dict[str, Any]]:
    return {sweep["name"]: sweep for sweep in tomllib.loads(path.read_text(encoding="utf-8"))["sweep"]}


def switch_overrides(switches: dict[str, Any]) -> list[str]:
    """A run's `switches` table (a layout and the script's on / off lines, as a published table's columns give
    them) as Megatron Hydra overrides: TP and CP for actor and reference, verl's offloads, the script's full
    uniform recompute of one layer, the three dynamic-batch switches and the rollout's utilization."""
    actor, ref = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
    overrides = [f"{role}.megatron.{key}={switches[name]}" for role in (actor, ref)
                 for key, name in (("tensor_model_parallel_size", "tp"), ("context_parallel_size", "cp"))]
    offload = switches["offload"]
    overrides += [f"{actor}.megatron.{key}={offload}" for key in ("param_offload", "grad_offload", "optimizer_offload")]
    overrides += [f"{ref}.megatron.param_offload={offload}"]
    if switches["recompute"]:
        transformer = f"+{actor}.megatron.override_transformer_config"
        overrides += [f"{transformer}.recompute_method=uniform", f"{transformer}.recompute_granularity=full",
                      f"{transformer}.recompute_num_layers=1"]
    dynamic = switches["dynamic"]
    overrides += [f"{actor}.use_dynamic_bsz={dynamic}", f"{ref}.log_prob_use_dynamic_bsz={dynamic}",
                  f"actor_rollout_ref.rollout.log_prob_use_dynamic_bsz={dynamic}",
                  f"actor_rollout_ref.rollout.gpu_memory_utilization={switches['utilization']}"]
    return overrides


def run_plan(sweep: dict[str, Any], run: dict[str, Any]) -> Plan:
    """The run's plan as `rlplan import verl` reads its overrides, at the run's mean lengths and at the sweep's
    `verl` release where it names one (as --verl-version), else the release the overrides imply."""
    switches = switch_overrides(run["switches"]) if "switches" in run else []
    overrides = "\n".join([*sweep["common"], *switches, *run.get("overrides", [])]) + "\n"
    imported = import_verl_script(overrides, gpu=resolve_gpu(sweep["gpu"]), host_memory_gib=2048.0, env={},
                                  local_config_reader=lambda path: None, versions=(sweep.get("verl"), None, None))
    prompt = int(run.get("prompt_mean", sweep.get("prompt_mean")))
    response = int(run.get("response_mean", sweep.get("response_mean")))
    return apply_knobs(imported.plan, {"data.expected_prompt_length": prompt,
                                       "data.expected_response_length": response})


def all_runs(sweeps: dict[str, dict[str, Any]]) -> list[Run]:
    """Every run with measured seconds (a run that died, `outcome` and no `measured`, has none to price); the keys
    its sweep marks `summed_over_rounds` are set apart from those compared."""
    runs = []
    for name, sweep in sweeps.items():
        summed = set(sweep.get("summed_over_rounds", ()))
        for run in sweep["run"]:
            if "measured" not in run:
                continue
            seconds = {k: float(v) for k, v in run["measured"].items()}
            runs.append(Run(sweep=name, label=run["id"], plan=run_plan(sweep, run),
                            measured={k: v for k, v in seconds.items() if k not in summed},
                            over_rounds={k: v for k, v in seconds.items() if k in summed}))
    return runs


def predicted_timings(run: Run, profile: Profile) -> dict[str, float]:
    return verl_timing_seconds(predict_step_time(run.plan, predict_memory(run.plan, profile), profile))


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks."""
    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else float("nan")


def sweep_section(sweeps: dict[str, dict[str, Any]], runs: list[Run],
                  profile: Profile) -> tuple[list[str], dict]:
    """Markdown of every sweep's table and the summary numbers the README quotes."""
    lines: list[str] = []
    summary: dict[str, Any] = {"within": 0, "phases": 0, "sweeps": {}}
    for name, sweep in sweeps.items():
        members = [run for run in runs if run.sweep == name]
        predicted = [predicted_timings(run, profile) for run in members]
        stepped = [(p["step"], run.measured["step"]) for p, run in zip(predicted, members, strict=True)
                   if "step" in run.measured]
        rho = spearman([p for p, _ in stepped], [m for _, m in stepped]) if len(stepped) >= 2 else None
        if rho is not None:
            summary["sweeps"][name] = rho
        lines += [f"### {sweep['title']}", "", f"Source: {sweep['source']}; script {sweep['script']}.",
                  f"GPU preset `{sweep['gpu']}`. Lengths: {' '.join(sweep['lengths_source'].split())}.", "",
                  *rounds_lines(sweep, members, profile),
                  *gen_split_lines(sweep, members, profile),
                  "| run | " + " | ".join(f"{key} s measured / predicted (error)" for key in SHOWN) + " |",
                  "|---|" + "---|" * len(SHOWN)]
        for run, timing in zip(members, predicted, strict=True):
            cells = []
            for key in SHOWN:
                measured = run.measured.get(key)
                if key in run.over_rounds:
                    cells.append(f"{run.over_rounds[key]:.0f} (every round) / {timing.get(key, 0.0):.0f} (one round)")
                    continue
                if measured is None:
                    cells.append(f"- / {timing.get(key, 0.0):.0f}")
                    continue
                error = timing.get(key, 0.0) / measured - 1
                summary["phases"] += 1
                summary["within"] += abs(error) <= PHASE_ERROR_LIMIT
                cells.append(f"{measured:.0f} / {timing.get(key, 0.0):.0f} ({error:+.0%})")
            lines.append(f"| {run.label} | " + " | ".join(cells) + " |")
        lines += ["", f"Spearman rank correlation of step times over {len(stepped)} runs: **{rho:+.2f}** "
                  f"(target >= {RANK_TARGET})." if rho is not None else
                  "No rank correlation of step times: every run's step sums several generation rounds.", ""]
    return lines, summary


def rounds_lines(sweep: dict[str, Any], members: list[Run], profile: Profile) -> list[str]:
    """A sweep whose `gen` and `step` sum several generation rounds: why (its `rounds_source`), the measured ratio of
    `gen` (every round) to `generate_sequences` (the last round's engine call) that shows it, and that one round's
    engine call against the predicted rollout alone (decode and prefill, without weight sync or host work)."""
    if not sweep.get("summed_over_rounds"):
        return []
    keys = ", ".join(f"`{key}`" for key in sweep["summed_over_rounds"])
    text = f"Not compared: {keys}, which sum several generation rounds: {' '.join(sweep['rounds_source'].split())}."
    ratios = [run.over_rounds["gen"] / run.measured["generate_sequences"] for run in members
              if "gen" in run.over_rounds and "generate_sequences" in run.measured]
    if ratios:
        text += f" Measured `gen` / `generate_sequences`: {min(ratios):.2f}-{max(ratios):.2f}."
    rounds = []
    for run in members:
        if "generate_sequences" in run.measured:
            measured = run.measured["generate_sequences"]
            engine = engine_seconds(run, profile)
            rounds.append(f"{run.label.split(':')[0]} {measured:.0f} / {engine:.0f} ({engine / measured - 1:+.0%})")
    if rounds:
        text += (" One round's `generate_sequences` measured / the predicted rollout engine alone, row by row (not "
                 "counted above): " + "; ".join(rounds) + ".")
    return [text, ""]


def gen_split(run: Run, profile: Profile) -> tuple[float, float]:
    """The predicted `gen` of one run in two: the rollout engine's generation (what verl's `generate_sequences`
    timer holds) and the rest (weight sync, wake/sleep, the batch to and from the ranks, host processing)."""
    engine = engine_seconds(run, profile)
    return engine, predicted_timings(run, profile)["gen"] - engine


def gen_split_lines(sweep: dict[str, Any], members: list[Run], profile: Profile) -> list[str]:
    """A sweep that publishes `generate_sequences` beside a one-round `gen`: each row's `gen` split into the engine's
    call and the rest, measured / predicted. verl (v0.5.0 megatron_workers.py and fsdp_workers.py generate_sequences)
    times the engine's call per rank and averages it over the ranks (utils/profiler/performance.py reduce_timing,
    ReduceOp.AVG), while the driver's `gen` lasts until the slowest rank has returned its batch: the rest therefore
    also holds the slowest engine's lead over the mean one."""
    if sweep.get("summed_over_rounds"):
        return []
    cells = []
    for run in members:
        if "gen" not in run.measured or "generate_sequences" not in run.measured:
            continue
        engine, rest = gen_split(run, profile)
        generating = run.measured["generate_sequences"]
        other = run.measured["gen"] - generating
        cells.append(f"row {run.label.split(':')[0]}: {generating:.0f} / {engine:.0f} ({engine / generating - 1:+.0%}), "
                     f"rest {other:.0f} / {rest:.0f}")
    if not cells:
        return []
    return ["`gen` in two, row by row (not counted above): the engine's call, `generate_sequences` (verl's mean over "
            "the ranks) measured / the predicted rollout engine alone (error), then the rest of `gen` (weight sync, "
            "wake and sleep, the batch to and from the ranks, host work, and the slowest engine's lead over the mean "
            "one) measured / predicted: " + "; ".join(cells) + ".", ""]


def engine_seconds(run: Run, profile: Profile) -> float:
    """The rollout engine's generation of one batch, as planner.steptime.rollout prices it."""
    return rollout_seconds(run.plan, predict_memory(run.plan, profile), Rates(run.plan, profile), profile,
                           plan_layout(run.plan))


# The phases the training backend prices (the rollout's is the engine's, the same for FSDP and Megatron).
TRAINER_PHASES = ("old_log_prob", "update_actor")


def trainer_rank_lines(sweeps: dict[str, dict[str, Any]], runs: list[Run], profile: Profile) -> list[str]:
    """Rank correlation of the trainer's own phases (old_log_prob + update_actor) per sweep: the part of the
    step the Megatron backend prices, apart from the rollout engine's."""
    cells = []
    for name in sweeps:
        members = [run for run in runs if run.sweep == name]
        predicted = [sum(predicted_timings(run, profile).get(key, 0.0) for key in TRAINER_PHASES) for run in members]
        measured = [sum(run.measured.get(key, 0.0) for key in TRAINER_PHASES) for run in members]
        cells.append(f"{name} {spearman(predicted, measured):+.2f}")
    return ["Rank correlation of the trainer's phases alone (old_log_prob + update_actor, what "
            "planner/steptime/megatron.py prices; `gen` is the rollout engine's model): " + ", ".join(cells) + ".",
            ""]


def megatron_lines(sweeps: dict[str, dict[str, Any]], runs: list[Run], profile: Profile) -> list[str]:
    """The Megatron runs' tables: priced with the constants fitted to the FSDP runs, so out of sample."""
    if not sweeps:
        return []
    tables, summary = sweep_section(sweeps, runs, profile)
    return ["### Megatron runs (out of sample)", "",
            *trainer_rank_lines(sweeps, runs, profile),
            f"From benchmarks/data/{MEGATRON_DATA.name}, priced by the Megatron step-time backend "
            "(planner/steptime/megatron.py) with the same profile; the FSDP protocol's fit never reads these runs. "
            f"Summary: {summary['within']} of {summary['phases']} phases within {PHASE_ERROR_LIMIT:.0%}; rank "
            "correlation " + ", ".join(f"{name} {rho:+.2f}" for name, rho in summary["sweeps"].items()) + ".", "",
            *[line.replace("### ", "#### ", 1) if line.startswith("### ") else line for line in tables]]


def render_section(sweeps: dict[str, dict[str, Any]], runs: list[Run], profile: Profile,
                   megatron: tuple[dict[str, dict[str, Any]], list[Run]] = ({}, [])) -> str:
    tables, summary = sweep_section(sweeps, runs, profile)
    header = [
        SECTION_HEADING, "",
        "Generated by `python benchmarks/steptime_sweeps.py --write docs/accuracy.md` from "
        "benchmarks/data/steptime_sweeps.toml (published configurations and their measured `timing_s/*`, "
        "with sources). Each run is imported from its overrides, priced at its published mean lengths with "
        f"the profile `{profile.name}`. `gen` is predicted as rollout + weight sync, `update_actor` as the "
        "update + the actor's offload traffic; `step` as every predicted phase (reward, advantages and "
        "checkpointing are not priced). The model and its constants: docs/steptime.md. The constants were "
        "fitted to these runs and the public logs together (`python benchmarks/steptime_holdout.py --fit`), so "
        "these are in-sample numbers; section 5a has them out of sample.", "",
        f"Summary: {summary['within']} of {summary['phases']} phases within {PHASE_ERROR_LIMIT:.0%}; rank "
        "correlation per sweep " + ", ".join(f"{name} {rho:+.2f}" for name, rho in summary["sweeps"].items())
        + ".", "",
    ]
    return "\n".join(header + tables + megatron_lines(*megatron, profile))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None, help="markdown file whose section 5 to regenerate")
    parser.add_argument("--profile", type=Path, default=None, help="profile TOML to price with (default: built in)")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--megatron-data", type=Path, default=MEGATRON_DATA)
    args = parser.parse_args(argv)
    profile = (load_profile_toml(args.profile.read_text(encoding="utf-8"), str(args.profile))
               if args.profile else DEFAULT_PROFILE)
    sweeps = load_sweeps(args.data)
    runs = all_runs(sweeps)
    megatron_sweeps = load_sweeps(args.megatron_data) if args.megatron_data.exists() else {}
    section = render_section(sweeps, runs, profile, (megatron_sweeps, all_runs(megatron_sweeps)))
    return print_or_write_section(section, SECTION_HEADING, args.write)


if __name__ == "__main__":
    sys.exit(main())
