"""Golden outputs of the `rlplan` command: a fixed sweep of invocations, each one's stdout, stderr, exit code and
the files it wrote, to a folder; two folders from two trees are compared with `diff -r`.

A refactor that only moves code keeps every byte of these (issue 38). The sweep: every examples/ plan through
validate / explain / render (all targets), every examples/ and tests/data/verl_scripts/ script through
`import verl` and its plan through validate and explain, the README tour, `compare` / `calibrate` on a public
verl log, and a sweep of `solve` requests (FSDP and Megatron, --strategy auto, --top, --verify, --json,
infeasible ones with their diagnoses, --device cpu, bad input).

Run: `python benchmarks/golden_outputs.py OUT_DIR [--only SUBSTRING ...]`, then
`diff -r OUT_BEFORE OUT_AFTER`. Each invocation is a whole `rlplan` process (the console script beside
`sys.executable`), in a scratch folder where `examples` and `data` (tests/data) are links into the repository,
so every path it prints is relative and the same from any checkout. Wall seconds per invocation go to
OUT_DIR/../<name>.seconds.tsv, outside the compared folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(path.name for path in (ROOT / "examples").iterdir() if (path / "plan.toml").is_file())
VERL_SCRIPTS = {  # tests/data/verl_scripts/README.md: the --env each needs
    "grpo_lora_shell_vars.sh": ["--env", "NGPUS=8"],
    "ppo_offload_deprecated_globals.sh": ["--env", "DATA_DIR=/data"],
    "dynamic_bsz_ulysses.sh": [],
    "overrides_lora_valid.txt": [],
    "megatron_dense_qwen2_7b.sh": ["--env", "HOME=/home/u"],
    "megatron_dense_lora_qwen2_7b.sh": ["--env", "HOME=/home/u"],
    "megatron_moe_qwen3_30b_a3b.sh": ["--env", "HOME=/home/u", "--env", "TEST_FILE=/data/test.parquet"],
    "megatron_moe_lora_qwen3_30b_a3b.sh": ["--env", "HOME=/home/u"],
    "sglang_multiturn_qwen2.5_3b.sh": ["--env", "PROJECT_DIR=/verl", "--env", "HOME=/home/u"],
}
H100 = ["--gpu", "h100-80g"]
SEVEN_B = ["--model", "qwen2.5-7b", "--gpus", "8", *H100, "--prompt-len", "1024", "--response-len", "2048"]
MOE_30B = ["--model", "qwen3-30b-a3b", "--gpus", "16", *H100, "--prompt-len", "1024", "--response-len", "4096",
           "--train-batch-size", "128", "--n", "8"]
BIG_72B = ["--model", "qwen2.5-72b", "--gpus", "64", *H100, "--algo", "grpo", "--prompt-len", "1024",
           "--response-len", "4096", "--train-batch-size", "512", "--n", "8"]


def _gallery_solves() -> list[tuple[str, list[str]]]:
    entries = tomllib.loads((ROOT / "examples" / "gallery.toml").read_text(encoding="utf-8"))["example"]
    return [(f"gallery-{entry['name']}", ["solve", *entry["solve"], "-o", f"{entry['name']}.toml"])
            for entry in entries if "import_verl" not in entry]


def _example_invocations() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for name in EXAMPLES:
        plan = f"examples/{name}/plan.toml"
        found += [
            (f"ex-{name}-validate", ["validate", plan]),
            (f"ex-{name}-validate-json", ["validate", plan, "--json"]),
            (f"ex-{name}-explain", ["explain", plan]),
            (f"ex-{name}-explain-json", ["explain", plan, "--json"]),
            (f"ex-{name}-render-verl", ["render", plan, "--target", "verl"]),
            (f"ex-{name}-render-overrides", ["render", plan, "--target", "verl", "--format", "overrides"]),
            (f"ex-{name}-render-slurm", ["render", plan, "--target", "slurm"]),
            (f"ex-{name}-render-ray", ["render", plan, "--target", "ray-job", "--json"]),
            (f"ex-{name}-import-run-sh", ["import", "verl", f"examples/{name}/run.sh", *H100]),
        ]
    return found


def _script_invocations() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for script, env in VERL_SCRIPTS.items():
        stem = script.rsplit(".", 1)[0]
        source = f"data/verl_scripts/{script}"
        found += [
            (f"script-{stem}-import", ["import", "verl", source, *H100, *env, "-o", f"{stem}.toml"]),
            (f"script-{stem}-import-json", ["import", "verl", source, *H100, *env, "--json"]),
            (f"script-{stem}-validate", ["validate", f"{stem}.toml"]),
            (f"script-{stem}-explain-json", ["explain", f"{stem}.toml", "--json"]),
            (f"script-{stem}-render", ["render", f"{stem}.toml", "--target", "verl"]),
        ]
    return found


def _tour_invocations() -> list[tuple[str, list[str]]]:
    public = "data/verl_logs/public"
    return [
        ("tour-solve", ["solve", *SEVEN_B, "-o", "plan.toml"]),
        ("tour-explain", ["explain", "plan.toml"]),
        ("tour-import", ["import", "verl", "data/verl_scripts/grpo_lora_shell_vars.sh", *H100, "--env", "NGPUS=8",
                         "-o", "imported.toml"]),
        ("tour-validate", ["validate", "imported.toml"]),
        ("tour-solve-from", ["solve", "--from", "imported.toml", "-o", "fixed.toml"]),
        ("tour-render", ["render", "fixed.toml", "--target", "verl", "-o", "run.sh"]),
        ("tour-compare", ["compare", f"{public}/qwen2_7b_gsm8k_8gpu_min.sh", f"{public}/verl_qwen2_7b_min.log",
                          *H100, "--fix", "rollout.enforce_eager=true"]),
        ("tour-compare-json", ["compare", f"{public}/qwen2_7b_gsm8k_8gpu_min.sh", f"{public}/verl_qwen2_7b_min.log",
                               *H100, "--fix", "rollout.enforce_eager=true", "--json"]),
        ("tour-calibrate", ["calibrate", "--from-verl-log", f"{public}/verl_qwen2_7b_min.log", "--plan",
                            f"{public}/qwen2_7b_gsm8k_8gpu_min.sh", *H100, "--fix", "rollout.enforce_eager=true",
                            "-o", "p.toml"]),
        ("tour-compare-profile", ["compare", f"{public}/qwen2_7b_gsm8k_8gpu_min.sh",
                                  f"{public}/verl_qwen2_7b_min.log", *H100, "--fix", "rollout.enforce_eager=true",
                                  "--profile", "p.toml"]),
        ("tour-compare-ppo", ["compare", f"{public}/run_demo_qwen2.5b_ppo_8gpu.sh",
                              f"{public}/verl_ppo_qwen2.5b_8gpu.log", *H100]),
    ]


def _solve_invocations() -> list[tuple[str, list[str]]]:
    return [
        ("solve-7b-top", ["solve", *SEVEN_B, "--top", "5", "-o", "s7b.toml"]),
        ("solve-7b-json", ["solve", *SEVEN_B, "--json"]),
        ("solve-7b-quiet", ["solve", *SEVEN_B, "-q", "-o", "s7b-quiet.toml"]),
        ("solve-7b-memory", ["solve", *SEVEN_B, "--objective", "memory", "--lora", "off", "-o", "s7b-mem.toml"]),
        ("solve-7b-fix", ["solve", *SEVEN_B, "--fix", "actor.param_offload=true", "--fix",
                          "rollout.tensor_model_parallel_size=4", "-o", "s7b-fix.toml"]),
        ("solve-7b-sglang", ["solve", *SEVEN_B, "--rollout", "sglang", "-o", "s7b-sglang.toml"]),
        ("solve-7b-rollout-auto", ["solve", *SEVEN_B, "--rollout", "auto", "--json"]),
        ("solve-7b-max-response", ["solve", "--model", "qwen2.5-7b", "--gpus", "8", *H100, "--prompt-len", "1024",
                                   "--max-response-len", "16384", "-o", "s7b-maxlen.toml"]),
        ("solve-7b-headroom", ["solve", *SEVEN_B, "--headroom", "10%", "-o", "s7b-headroom.toml"]),
        ("solve-7b-old-verl", ["solve", *SEVEN_B, "--verl-version", "0.4.1", "-o", "s7b-041.toml"]),
        ("solve-7b-megatron", ["solve", *SEVEN_B, "--strategy", "megatron", "--top", "5", "-o", "s7b-meg.toml"]),
        ("solve-7b-megatron-json", ["solve", *SEVEN_B, "--strategy", "megatron", "--json"]),
        ("solve-7b-auto", ["solve", *SEVEN_B, "--strategy", "auto", "--top", "3", "-o", "s7b-auto.toml"]),
        ("solve-30b-moe-megatron", ["solve", *MOE_30B, "--strategy", "megatron", "--top", "8",
                                    "-o", "s30b-meg.toml"]),
        ("solve-30b-moe-megatron-fix", ["solve", *MOE_30B, "--strategy", "megatron", "--fix",
                                        "actor.megatron.expert_model_parallel_size=8", "--json"]),
        ("solve-72b-64", ["solve", *BIG_72B, "-o", "s72b.toml"]),
        ("solve-72b-64-ppo", ["solve", *BIG_72B[:-4], "--train-batch-size", "512", "--n", "1", "--algo", "ppo",
                              "--lora", "off", "--top", "3", "-o", "s72b-ppo.toml"]),
        ("solve-32b-16-megatron", ["solve", "--model", "qwen2.5-32b", "--gpus", "16", *H100, "--prompt-len", "1024",
                                   "--response-len", "4096", "--train-batch-size", "512", "--n", "8",
                                   "--strategy", "megatron", "-o", "s32b-meg.toml"]),
        ("solve-infeasible-72b-1gpu", ["solve", "--model", "qwen2.5-72b", "--gpus", "1", *H100, "--prompt-len",
                                       "1024", "--response-len", "4096", "--lora", "off", "-o", "never.toml"]),
        ("solve-infeasible-72b-1gpu-json", ["solve", "--model", "qwen2.5-72b", "--gpus", "1", *H100,
                                            "--prompt-len", "1024", "--response-len", "4096", "--lora", "off",
                                            "--json"]),
        ("solve-infeasible-megatron", ["solve", "--model", "qwen2.5-72b", "--gpus", "2", *H100, "--prompt-len",
                                       "1024", "--response-len", "4096", "--lora", "off", "--strategy", "megatron"]),
        ("solve-infeasible-megatron-json", ["solve", "--model", "qwen2.5-72b", "--gpus", "2", *H100,
                                            "--prompt-len", "1024", "--response-len", "4096", "--lora", "off",
                                            "--strategy", "megatron", "--json"]),
        ("solve-infeasible-fix", ["solve", *SEVEN_B, "--fix", "actor.ppo_micro_batch_size_per_gpu=4096",
                                  "--fix", "actor.use_dynamic_bsz=false"]),
        ("solve-infeasible-a100-40", ["solve", "--model", "qwen2.5-32b", "--gpus", "1", "--gpu", "a100-40g",
                                      "--prompt-len", "1024", "--response-len", "8192", "--json"]),
        ("solve-cpu", ["solve", "--device", "cpu", "--model", "qwen2.5-0.5b", "--prompt-len", "128",
                       "--response-len", "128", "--train-batch-size", "8", "--n", "2", "--host-mem", "64",
                       "-o", "cpu.toml"]),
        ("solve-cpu-json", ["solve", "--device", "cpu", "--gpus", "2", "--model", "qwen2.5-0.5b", "--prompt-len",
                            "128", "--response-len", "128", "--train-batch-size", "8", "--n", "2",
                            "--host-mem", "64", "--json"]),
        ("solve-verify", ["solve", "--model", "qwen2.5-0.5b", "--gpus", "1", *H100, "--prompt-len", "256",
                          "--response-len", "256", "--train-batch-size", "32", "--n", "2", "--lora", "off",
                          "--verify", "--top", "2", "-o", "verify.toml"]),
        ("solve-gpu-mem", ["solve", "--model", "qwen2.5-3b", "--gpus", "4", "--gpu-mem", "48GB", "--gpu-tflops",
                           "300", "--gpu-bandwidth", "1500", "--prompt-len", "512", "--response-len", "1024",
                           "-o", "gpumem.toml"]),
        ("solve-bad-model", ["solve", "--model", "no-such-model", "--gpus", "8", *H100, "--prompt-len", "1024"]),
        ("solve-bad-model-json", ["solve", "--model", "no-such-model", "--gpus", "8", *H100, "--prompt-len", "1024",
                                  "--json"]),
        ("solve-bad-fix", ["solve", *SEVEN_B, "--fix", "actor.no_such_knob=1"]),
        ("solve-bad-strategy", ["solve", *SEVEN_B, "--strategy", "deepspeed"]),
        ("solve-no-gpu", ["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--prompt-len", "1024"]),
    ]


def _misc_invocations() -> list[tuple[str, list[str]]]:
    return [
        ("version", ["--version"]),
        ("help", ["--help"]),
        ("help-solve", ["solve", "--help"]),
        ("presets-models", ["presets", "models"]),
        ("presets-gpus-json", ["presets", "gpus", "--json"]),
        ("schema", ["schema"]),
        ("validate-missing", ["validate", "no-such-plan.toml"]),
        ("validate-missing-json", ["validate", "no-such-plan.toml", "--json"]),
    ]


def invocations() -> list[tuple[str, list[str]]]:
    """In order: later ones read what earlier ones wrote (the tour's plan.toml, each script's imported plan)."""
    return [*_misc_invocations(), *_example_invocations(), *_script_invocations(), *_tour_invocations(),
            *_gallery_solves(), *_solve_invocations()]


def _environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONDONTWRITEBYTECODE", "COLUMNS")}
    env.update({"COLUMNS": "120", "TERM": "dumb", "NO_COLOR": "1", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0"})
    return env


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file() and not path.is_symlink()}


def run_sweep(out: Path, only: list[str], skip: list[str]) -> None:
    rlplan = shutil.which("rlplan", path=str(Path(sys.executable).parent)) or "rlplan"
    out.mkdir(parents=True, exist_ok=True)
    seconds = []
    with tempfile.TemporaryDirectory(prefix="rlplan-golden-") as scratch:
        work = Path(scratch)
        (work / "examples").symlink_to(ROOT / "examples")
        (work / "data").symlink_to(ROOT / "tests" / "data")
        for name, argv in invocations():
            if (only and not any(part in name for part in only)) or any(part in name for part in skip):
                continue
            before = _snapshot(work)
            start = time.perf_counter()
            done = subprocess.run([rlplan, *argv], cwd=work, env=_environment(), capture_output=True)
            seconds.append((name, time.perf_counter() - start))
            target = out / name
            target.mkdir(exist_ok=True)
            (target / "argv").write_text(" ".join(["rlplan", *argv]) + "\n", encoding="utf-8")
            (target / "stdout").write_bytes(done.stdout)
            (target / "stderr").write_bytes(done.stderr)
            (target / "exit").write_text(f"{done.returncode}\n", encoding="utf-8")
            for file, data in _snapshot(work).items():
                if before.get(file) != data:
                    (target / f"wrote-{file}").write_bytes(data)
            print(f"{done.returncode:3d} {seconds[-1][1]:7.2f} s  {name}", flush=True)
    (out.parent / f"{out.name}.seconds.tsv").write_text("".join(f"{n}\t{s:.3f}\n" for n, s in seconds),
                                                        encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Folder to write (one sub-folder per invocation).")
    parser.add_argument("--only", nargs="*", default=[], help="Run only invocations whose name contains one of these.")
    parser.add_argument("--skip", nargs="*", default=[], help="Skip invocations whose name contains one of these.")
    args = parser.parse_args()
    run_sweep(args.out, args.only, args.skip)


if __name__ == "__main__":
    main()
