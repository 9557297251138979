"""Whole `rlplan solve` processes beside a bare interpreter importing attrs, in one run, as ratios.

The targets (issue 38, issue 39): a 72B model on 64 GPUs within 5x a bare `python -c 'import attrs'`, and a
Megatron solve (a 30B MoE on 16 GPUs, a 7B on 8) under a second, whole processes on the 2-core development
machine. Each case runs as a separate process, the cases taking turns (round `i` runs every case once) so
that a busy machine slows them alike; each process's CPU seconds (user + system, from the kernel's child
accounting) are reported beside its wall seconds: on a shared machine the CPU seconds are what the code costs,
the wall seconds what a user waits. Byte-compiled files are written on a warm-up run first, as an installed
package has them.

Run: `python benchmarks/solve_time.py [--repeats 5] [--before OTHER_VENV/bin/python]`; with --before, every solve
case also runs with that environment's `rlplan` (another checkout, e.g. main before a change), in the same rounds.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASELINE = "python -c 'import attrs' (baseline)"
H100 = ["--gpu", "h100-80g", "--prompt-len", "1024"]
CASES: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    BASELINE: [sys.executable, "-c", "import attrs"],
    "import rlplan CLI": [sys.executable, "-c", "import rlplan.planner.commands.cli"],
    "solve qwen2.5-7b, 8x H100": [
        "--model", "qwen2.5-7b", "--gpus", "8", *H100, "--algo", "grpo", "--response-len", "2048",
        "--train-batch-size", "256", "--n", "5"],
    "solve qwen2.5-72b, 64x H100": [
        "--model", "qwen2.5-72b", "--gpus", "64", *H100, "--algo", "grpo", "--response-len", "4096",
        "--train-batch-size", "512", "--n", "8"],
    "solve qwen2.5-72b, 64x H100, PPO + critic": [
        "--model", "qwen2.5-72b", "--gpus", "64", *H100, "--algo", "ppo", "--response-len", "4096",
        "--train-batch-size", "512", "--n", "1", "--lora", "off"],
    "solve megatron qwen2.5-7b, 8x H100": [
        "--model", "qwen2.5-7b", "--gpus", "8", *H100, "--algo", "grpo", "--response-len", "2048",
        "--train-batch-size", "256", "--n", "5", "--strategy", "megatron"],
    "solve megatron qwen3-30b-a3b, 16x H100": [
        "--model", "qwen3-30b-a3b", "--gpus", "16", *H100, "--algo", "grpo", "--response-len", "4096",
        "--train-batch-size", "256", "--n", "5", "--strategy", "megatron"],
}


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall and CPU seconds of one whole process, and its exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env).returncode
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", type=Path, help="Another environment's python: its rlplan solves too.")
    args = parser.parse_args()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        commands = {}
        for label, python in (("", Path(sys.executable)), (" (before)", args.before)):
            if python is None:
                continue
            rlplan = shutil.which("rlplan", path=str(python.parent)) or "rlplan"
            for name, argv in CASES.items():
                if argv[0] != sys.executable:
                    commands[name + label] = [rlplan, "solve", *argv, "-q", "-o", f"{tmp}/plan.toml"]
                elif not label:
                    commands[name] = argv
        for command in commands.values():  # warm-up: byte-compiled files written, the page cache filled
            timed(command, env)
        walls: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        codes: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, command in commands.items():
                wall, cpu, codes[name] = timed(command, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
    base_wall, base_cpu = statistics.median(walls[BASELINE]), statistics.median(cpus[BASELINE])
    print(f"{'case (median of ' + str(args.repeats) + ')':52s} {'wall s':>7s} {'x base':>7s} {'cpu s':>7s} "
          f"{'x base':>7s}  exit")
    for name in commands:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name:52s} {wall:7.3f} {wall / base_wall:7.2f} {cpu:7.3f} {cpu / base_cpu:7.2f}  {codes[name]}")


if __name__ == "__main__":
    main()
