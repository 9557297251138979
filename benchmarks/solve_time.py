"""Wall time of whole `rlplan solve` processes, beside a bare interpreter start in the same run.

The target: a 72B model on 64 GPUs solves in under 0.5 s per process on the development
machine (2 cores). Run: `python benchmarks/solve_time.py [--repeats 5]`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "bare python (baseline)": [sys.executable, "-c", "pass"],
    "import rlplan CLI (baseline)": [sys.executable, "-c", "import rlplan.planner.commands.cli"],
    "solve qwen2.5-7b, 8x H100": [
        "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--algo", "grpo", "--prompt-len", "1024",
        "--response-len", "2048", "--train-batch-size", "256", "--n", "5",
    ],
    "solve qwen2.5-72b, 64x H100": [
        "--model", "qwen2.5-72b", "--gpus", "64", "--gpu", "h100-80g", "--algo", "grpo", "--prompt-len", "1024",
        "--response-len", "4096", "--train-batch-size", "512", "--n", "8",
    ],
    "solve qwen2.5-72b, 64x H100, PPO + critic": [
        "--model", "qwen2.5-72b", "--gpus", "64", "--gpu", "h100-80g", "--algo", "ppo", "--prompt-len", "1024",
        "--response-len", "4096", "--train-batch-size", "512", "--n", "1", "--lora", "off",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rlplan = shutil.which("rlplan") or str(Path(sys.executable).with_name("rlplan"))
    print(f"{'case':46s} {'median s':>9s} {'min s':>7s} {'max s':>7s}  exit")
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in CASES.items():
            command = argv if name.endswith("(baseline)") else [rlplan, "solve", *argv, "-o", f"{tmp}/plan.toml"]
            times, code = [], 0
            for _ in range(args.repeats):
                start = time.perf_counter()
                code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
                times.append(time.perf_counter() - start)
            print(f"{name:46s} {statistics.median(times):9.3f} {min(times):7.3f} {max(times):7.3f}  {code}")


if __name__ == "__main__":
    main()
