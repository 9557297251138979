"""Render rlplan's three pictures end to end and check that they show something.

    python benchmarks/render_charts.py [--out build/charts] [--chromium /usr/bin/chromium] [--update-docs]

Through the real CLI (needs `pip install -e '.[charts]'` and Pillow), for the README's 7B GRPO
workload on 8 x A100-40G (a cluster where some candidates do not fit, so the frontier shows both):
  1. `rlplan solve ... --top 3 --frontier frontier.{html,png,svg}` writes plan.toml,
  2. `rlplan explain plan.toml --chart memory.{html,png,svg}`,
  3. `rlplan report RUN_DIR -o report.{html,png,svg}` on a synthetic run directory: plan.toml beside a
     metrics.jsonl of made-up steps (measured memory = the prediction times a seeded factor), whose
     last line is cut off as a run still writing would leave it.
Each PNG must have more than one distinct pixel colour and ink at least 1 % of its pixels. With Chromium, each HTML file is opened headless
and screenshotted, and the screenshot must too (the page drew a chart, offline, from the inlined Vega).
Without Chromium that step is said to be skipped and only the PNG/SVG files are checked.
--update-docs copies the three PNGs, palette-compressed, to docs/img/ for the README.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLVE = ["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "a100-40g", "--algo", "grpo",
         "--prompt-len", "1024", "--response-len", "2048", "--train-batch-size", "256", "--n", "5", "--top", "3"]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1600,1200"]
SUFFIXES = (".html", ".png", ".svg")


def rlplan(*args: str) -> None:
    command = [sys.executable, "-c", "from rlplan.planner.commands.cli import main; main()", *args]
    print("$ rlplan " + " ".join(args), flush=True)
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        sys.exit(f"rlplan {args[0]} exited {completed.returncode}:\n{completed.stdout}{completed.stderr}")


def synthetic_run(plan_file: Path, directory: Path, steps: int = 12) -> Path:
    """A run directory as `rlplan run` leaves one mid-run; every number is made up, seeded."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(plan_file, directory / "plan.toml")
    predicted = tomllib.loads(plan_file.read_text())["prediction"]
    rng = random.Random(14)
    factor = {phase: rng.uniform(0.85, 1.0) for phase in predicted["phase_peak_gib"]}
    lines = []
    for step in range(1, steps + 1):
        record = {"step": step, "reward_mean": 0.2 + 0.5 * (1 - 0.8 ** step) + rng.uniform(-0.03, 0.03),
                  "kl_ref": 0.002 * step * rng.uniform(0.8, 1.2), "entropy": 0.9 - 0.02 * step + rng.uniform(0, 0.02),
                  "response_length_mean": 600 + 25 * step + rng.uniform(-20, 20),
                  "sync_logprob_gap": rng.uniform(0.002, 0.004), "memory_measure": "cuda_max_memory_allocated",
                  "time/step": 0.0}
        for phase, seconds in predicted["phase_seconds"].items():
            if phase in predicted["phase_peak_gib"]:  # the step-time model's extra terms are no runtime phase
                record[f"time/{phase}"] = seconds * rng.uniform(0.9, 1.3)
        record["time/step"] = sum(v for k, v in record.items() if k.startswith("time/") and k != "time/step")
        for phase, gib in predicted["phase_peak_gib"].items():
            record[f"memory/{phase}_peak_gib"] = gib * factor[phase] * rng.uniform(0.99, 1.0)
        lines.append(json.dumps(record, sort_keys=True))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + '\n{"entropy": 0.66, "kl_r')
    return directory


def drawn(png: Path) -> tuple[int, float]:
    """Distinct pixel colours, and the share of pixels that are not the white page."""
    from PIL import Image

    with Image.open(png) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
    total = sum(count for count, _ in colours)
    white = sum(count for count, rgb in colours if min(rgb) >= 250)
    return len(colours), (total - white) / total if total else 0.0


def check(png: Path, what: str, failures: list[str]) -> None:
    # A blank page is one colour; an error message alone inks far less than 1 % of a chart-sized page.
    colours, inked = drawn(png)
    print(f"{what}: {colours} distinct colours, {100 * inked:.1f} % of pixels drawn")
    if colours <= 1 or inked < 0.01:
        failures.append(f"{what} is blank")


def screenshot(chromium: str, html: Path, png: Path) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                        html.resolve().as_uri()], capture_output=True, timeout=120, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/charts", help="where the charts go")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--update-docs", action="store_true", help="copy the PNGs to docs/img/")
    options = parser.parse_args()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = out / "plan.toml"
    for suffix in SUFFIXES:
        rlplan(*SOLVE, "-o", str(plan), "--frontier", str(out / f"frontier{suffix}"))
    run_dir = synthetic_run(plan, out / "synthetic-run")
    for suffix in SUFFIXES:
        rlplan("explain", str(plan), "--chart", str(out / f"memory{suffix}"))
        rlplan("report", str(run_dir), "-o", str(out / f"report{suffix}"))
    failures = []
    names = ("memory", "frontier", "report")
    for name in names:
        svg = (out / f"{name}.svg").read_text()
        if "<svg" not in svg or "<text" not in svg:
            failures.append(f"{name}.svg has no drawing")
        check(out / f"{name}.png", f"{name}.png", failures)
    if Path(options.chromium).is_file():
        for name in names:
            shot = out / f"{name}.screenshot.png"
            screenshot(options.chromium, out / f"{name}.html", shot)
            check(shot, f"{name}.html in headless Chromium", failures)
    else:
        print(f"Chromium not found at {options.chromium}: HTML screenshots skipped; PNG/SVG checked only")
    if options.update_docs:
        from PIL import Image

        docs = ROOT / "docs" / "img"
        docs.mkdir(parents=True, exist_ok=True)
        for name in names:
            with Image.open(out / f"{name}.png") as image:
                image.convert("RGB").quantize(colors=64).save(docs / f"{name}.png", optimize=True)
            print(f"docs/img/{name}.png: {(docs / f'{name}.png').stat().st_size // 1024} KiB")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
