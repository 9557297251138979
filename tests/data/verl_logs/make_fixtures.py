"""Writes the synthetic verl logs beside this file, in verl's exact formats (run once; the files are committed).

The numbers are one run written four ways, so tests can check that every format and spelling reads the same:
  v02_console.log   verl 0.2: `timing/<phase>` spelling, `f"{v:.3f}"` values, no Ray prefix
  v03_console.log   verl 0.3-0.5: Ray's coloured `(TaskRunner pid=...)` prefix, tqdm lines between steps, a step
                    line cut by hand (bad), and a last line still being written (no newline)
  v08_console.log   verl 0.8+: `actor/perf/...` keys, `timing_s/update_weights`, numpy 2's `np.float64(...)` values
  v08_file.jsonl    verl's FileLogger: {"step": N, "data": {...}}, NaN as json.dumps writes it, a bad line, and a
                    truncated last line
Formats: verl/utils/logger/aggregate_logger.py concat_dict_to_str (console), verl/utils/tracking.py FileLogger.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).parent
STEPS = 40


def metrics(step: int) -> dict[str, float]:
    """One step: lengths grow 9 tokens/step from 1000; step 1 is slow (warm-up), step 10 validates."""
    allocated = 40.0 + 0.1 * step
    values = {
        "actor/pg_loss": math.nan if step == 7 else 0.01 * step,
        "perf/max_memory_allocated_gb": allocated,
        "perf/max_memory_reserved_gb": math.nan if step == 5 else allocated + 12.0,
        "perf/cpu_memory_used_gb": 120.0,
        "response_length/mean": 991.0 + 9.0 * step,
        "response_length/max": float(min(8192, 3000 + 50 * step)),
        "prompt_length/mean": 300.0,
        "prompt_length/max": 1000.0,
        "timing_s/gen": 200.0 if step == 1 else 60.0 + step % 3,
        "timing_s/old_log_prob": 30.0 if step == 1 else 10.0 + 0.5 * (step % 2),
        "timing_s/ref": 8.0,
        "timing_s/adv": 0.2,
        "timing_s/update_actor": 90.0 if step == 1 else 40.0 + step % 4,
    }
    if step == 10:
        values["timing_s/testing"] = 30.0
    values["timing_s/step"] = sum(v for k, v in values.items() if k.startswith("timing_s/"))
    values["perf/throughput"] = 256 * 5 * (300 + values["response_length/mean"]) / values["timing_s/step"] / 8
    return values


def v08(values: dict[str, float]) -> dict[str, float]:
    """verl 0.8's names: the engine workers' memory under actor/, the sync timed on its own."""
    out = {("actor/" + k if k.startswith("perf/max_memory") or k == "perf/cpu_memory_used_gb" else k): v
           for k, v in values.items()}
    out["timing_s/update_weights"] = 3.0
    return out


def console_line(values: dict[str, float], step: int, form: str) -> str:
    parts = [f"step:{step}"]
    for key, value in values.items():
        if form == "v02":
            parts.append(f"{key.replace('timing_s/', 'timing/')}:{value:.3f}")
        elif form == "v08":
            parts.append(f"{key}:np.float64({value!r})")
        else:
            parts.append(f"{key}:{value:.3f}")
    return " - ".join(parts)


def main() -> None:
    v02 = [console_line(metrics(s), s, "v02") for s in range(1, STEPS + 1)]
    (HERE / "v02_console.log").write_text("\n".join(v02) + "\n")

    lines = ["\x1b[36m(TaskRunner pid=3147479)\x1b[0m {'actor_rollout_ref': {'actor': {'strategy': 'fsdp'}}}"]
    for s in range(1, STEPS + 1):
        lines.append(f"\x1b[36m(TaskRunner pid=3147479)\x1b[0m {console_line(metrics(s), s, 'v03')}")
        lines.append(f"Training Progress:  {100 * s // STEPS}%|##        | {s}/{STEPS} [01:10<06:31, 64.47s/it]")
        if s == 12:
            lines.append("\x1b[36m(TaskRunner pid=3147479)\x1b[0m step:12 - this line was cut by a crashed writer")
    lines.append("\x1b[36m(WorkerDict pid=3148308)\x1b[0m NCCL INFO ok\x1b[32m [repeated 7x across cluster]\x1b[0m")
    partial = console_line(metrics(STEPS + 1), STEPS + 1, "v03")
    (HERE / "v03_console.log").write_text("\n".join(lines) + "\n" + partial[: len(partial) // 2])

    v08_lines = [console_line(v08(metrics(s)), s, "v08") for s in range(1, STEPS + 1)]
    (HERE / "v08_console.log").write_text("\n".join(v08_lines) + "\n")

    records = [json.dumps({"step": s, "data": v08(metrics(s))}) for s in range(1, STEPS + 1)]
    records.insert(20, '{"step": 21, "data": {"timing_s/gen": 6')  # a line a crashed writer left cut
    tail = json.dumps({"step": STEPS + 1, "data": v08(metrics(STEPS + 1))})
    (HERE / "v08_file.jsonl").write_text("\n".join(records) + "\n" + tail[:40])


if __name__ == "__main__":
    main()
