"""The public verl Megatron runs' memory counters against the planner: docs/accuracy.md section 4c, and the rows
planner/model_error.py widens a Megatron plan's allocated band with (presets/megatron_engine_start_rows.toml).

    python benchmarks/megatron_public_runs.py                                  # the section, on stdout
    python benchmarks/megatron_public_runs.py --write docs/accuracy.md         # regenerate its section 4c in place
    python benchmarks/megatron_public_runs.py --write-rows presets/megatron_engine_start_rows.toml

No public Megatron run with verl's phase counters and a launch script was found (presets/
megatron_public_evidence.toml lists what was examined and what each source lacks). Two logs show torch's counters
of the trainer process at one moment: verl's customized vLLM 0.6.3 worker prints them just before it allocates the
KV cache, when the trainer's state, the reference and the engine's weights are resident
(tests/data/verl_logs/public_megatron). The launch line each log echoes is imported as `rlplan import verl` reads
it (`--gpu h100-80g --verl-version 0.3.0.post1`), and the moment priced as the trainer's state at the engine's
start (memory/rollout.py trainer_bytes_at_engine_start, which vLLM's start-up check and KV formula also read) plus
the engine's weights. Nothing here is fitted. Pure planner: no torch.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from attrs import frozen

from rlplan.planner.commands.cli import parse_fixes
from rlplan.planner.commands.compare_commands import load_plan_or_script
from rlplan.planner.memory.megatron import other_stages_weight_bytes
from rlplan.planner.memory.rollout import rollout_budget, trainer_bytes_at_engine_start
from rlplan.planner.model_error import (
    MEGATRON_EVIDENCE_FILE,
    AccuracyRow,
    allocator_regime,
    backend_evidence,
    error_band,
)
from rlplan.planner.package_data import package_toml
from rlplan.planner.plan import Plan

# benchmarks/ is no package: its shared helpers are imported from beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sections import print_or_write_section  # noqa: E402
from public_verl_runs import rows_toml  # noqa: E402  (the rows' TOML, as section 4's)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "verl_logs" / "public_megatron"
SECTION_HEADING = "## 4c. Public verl Megatron runs: the engine's start against the planner"
GPU = "h100-80g"
# Both runs predate verl's first release rlplan prices; its Megatron workers are theirs (AllGatherPPModel, vLLM
# 0.6.3 customized).
VERL_VERSION = "0.3.0.post1"
SOURCE = "public-engine-start"
GB = 1e9  # the log's unit: torch.cuda.memory_allocated() / 1e9
MIB = 2**20
ROWS_HEADING = ("# Two public verl Megatron runs' counters at the engine's start (rank 0, before vLLM allocates its KV "
                "cache) beside the\n# planner's prediction; planner/model_error.py widens a Megatron plan's allocated "
                "band with them. Nothing fitted.\n# Written by benchmarks/megatron_public_runs.py --write-rows; do "
                "not edit by hand. MiB = 2**20 bytes; error = predicted / measured - 1.\n")
_BEFORE_CACHE = re.compile(r"before init cache memory allocated: ([0-9.]+)GB, reserved: ([0-9.]+)GB")


@frozen
class MegatronRun:
    label: str
    stem: str  # tests/data/verl_logs/public_megatron/<stem>.sh and .log


RUNS = (
    MegatronRun(label="deepseek-llm-7b PPO, TP 4", stem="deepseek_llm_7b_megatron_ppo"),
    MegatronRun(label="Qwen2-7B GRPO, TP 4 x PP 2", stem="qwen2_7b_megatron_grpo"),
)


@frozen
class EngineStart:
    """One run's counters before the KV cache and the planner's prediction of the allocated one."""

    run: MegatronRun
    plan: Plan
    allocated_bytes: float
    reserved_bytes: float
    trainer_bytes: int
    engine_weight_bytes: int
    other_stages_bytes: int  # the legacy hybrid engine's other pipeline stages, within trainer_bytes

    @property
    def predicted_bytes(self) -> int:
        return self.trainer_bytes + self.engine_weight_bytes

    @property
    def error(self) -> float:
        return self.predicted_bytes / self.allocated_bytes - 1


def imported_plan(run: MegatronRun) -> Plan:
    plan, _ = load_plan_or_script(str(DATA / f"{run.stem}.sh"), gpu=GPU, gpu_mem=None, host_mem=1024.0, env=[],
                                  fixes=parse_fixes([]), verl_version=VERL_VERSION)
    return plan


def logged_before_cache(run: MegatronRun) -> tuple[float, float]:
    """(allocated, reserved) bytes the log prints just before the KV cache is allocated."""
    found = _BEFORE_CACHE.search((DATA / f"{run.stem}.log").read_text(encoding="utf-8"))
    if found is None:
        raise ValueError(f"{run.stem}.log has no 'before init cache' line")
    return float(found.group(1)) * GB, float(found.group(2)) * GB


def engine_start(run: MegatronRun) -> EngineStart:
    plan = imported_plan(run)
    allocated, reserved = logged_before_cache(run)
    return EngineStart(run=run, plan=plan, allocated_bytes=allocated, reserved_bytes=reserved,
                       trainer_bytes=trainer_bytes_at_engine_start(plan),
                       engine_weight_bytes=rollout_budget(plan).weights_bytes,
                       other_stages_bytes=other_stages_weight_bytes(plan))


def engine_start_rows(starts: list[EngineStart]) -> list[AccuracyRow]:
    return [AccuracyRow(source=SOURCE, model=s.run.label, phase="rollout", head="", strategy="megatron",
                        configuration=f"{s.run.stem}.sh, verl {VERL_VERSION}", counter="allocated",
                        regime=allocator_regime(True, False), measured_mib=round(s.allocated_bytes / MIB, 1),
                        predicted_mib=round(s.predicted_bytes / MIB, 1)) for s in starts]


def _gb(value: float) -> str:
    return f"{value / GB:.2f}"


def render_section(starts: list[EngineStart]) -> str:
    sources = package_toml(MEGATRON_EVIDENCE_FILE)["source"]
    evidence = backend_evidence("megatron")
    assert evidence is not None
    lines = [SECTION_HEADING, "",
             "Generated by `python benchmarks/megatron_public_runs.py --write docs/accuracy.md` from "
             "tests/data/verl_logs/public_megatron (its README says where each log is from). No public verl Megatron "
             "run on NVIDIA GPUs was found whose log shows verl's phase memory counters beside its launch script: "
             f"{evidence.phase_peak_runs} of the {evidence.sources} sources examined "
             f"(presets/{MEGATRON_EVIDENCE_FILE}) do. Two logs show torch's counters of the trainer process (rank 0) at "
             "one moment, just before verl's vLLM 0.6.3 allocates its KV cache: the trainer's state, the reference "
             "and the engine's weights are resident. Priced as `rlplan import verl` reads each log's launch line "
             f"(`--gpu {GPU} --verl-version {VERL_VERSION}`); GB = 10^9 bytes, as the logs print; nothing fitted.", "",
             "| run | logged allocated / reserved (GB) | predicted allocated (GB): trainer + engine weights "
             "| of which other PP stages | error |",
             "|---|---|---|---|---|"]
    for s in starts:
        lines.append(f"| {s.run.label} | {_gb(s.allocated_bytes)} / {_gb(s.reserved_bytes)} | "
                     f"{_gb(s.predicted_bytes)}: {_gb(s.trainer_bytes)} + {_gb(s.engine_weight_bytes)} | "
                     f"{_gb(s.other_stages_bytes)} | {100 * s.error:+.1f} % |")
    allocated, reserved = error_band("update", None, "megatron"), error_band("update", None, "megatron", "reserved")
    lines += ["",
              "The Qwen2 run's pipeline split showed a term the planner lacked: verl's legacy hybrid engine loads "
              "every pipeline stage's bf16 weights onto each GPU before it builds vLLM and around each generation "
              "(stack.MEGATRON_PP_STAGES_LOADED_FOR_ROLLOUT, verl before 0.4.0); without it the prediction was "
              "the other stages' weights lower. These moments measure the resident state only, not a phase's "
              "peak: they widen a Megatron plan's allocated band to their errors (planner/model_error.py), and the "
              "reserved band stays the stated assumption. A Megatron update's bands now read:", "",
              f"- {allocated.describe()}",
              f"- {reserved.describe()}", "",
              "The sources examined and why the others are not usable:", "",
              "| source | run | platform | counters | usable as |",
              "|---|---|---|---|---|"]
    for source in sources:
        usable = source["measures"] if source["measures"] != "none" else f"none: {source['why']}"
        lines.append(f"| {source['url']} | {source['run']} | {source['platform']} | {source['counters']} | "
                     f"{usable} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None, help="markdown file whose section 4c to regenerate")
    parser.add_argument("--write-rows", type=Path, default=None,
                        help="the engine-start rows of the bands (presets/megatron_engine_start_rows.toml)")
    args = parser.parse_args(argv)
    starts = [engine_start(run) for run in RUNS]
    if args.write_rows is not None:
        text = rows_toml(engine_start_rows(starts)).replace(rows_toml([]).rstrip("\n"), ROWS_HEADING.rstrip("\n"), 1)
        args.write_rows.write_text(text, encoding="utf-8")
        print(f"wrote {args.write_rows}")
        if args.write is None:
            return 0
    return print_or_write_section(render_section(starts), SECTION_HEADING, args.write)


if __name__ == "__main__":
    sys.exit(main())
