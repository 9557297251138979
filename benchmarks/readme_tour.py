"""The README's tour: the real output of its commands, regenerated.

    python benchmarks/readme_tour.py            # exit 1 and a diff when a block is stale
    python benchmarks/readme_tour.py --write    # rewrite the blocks in README.md

Each block follows a marker (`<!-- TOUR_SOLVE -->`) and is what its commands print today, stdout and stderr as a
terminal shows them, at TOUR_COLUMNS columns, run from a scratch folder as a new user would (the repository's own
scripts and logs by their path). Run it whenever a change moves what a tour command prints, and commit the diff;
tests/test_readme_tour.py holds README.md to it.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TOUR_COLUMNS = 110
PUBLIC = "tests/data/verl_logs/public"
# marker -> the commands of its block, in order, in one folder (validate reads what import wrote), each with what
# the block shows of it: "" (nothing: it sets up the next), "output", or "command" (a `$ rlplan ...` line, then
# the output).
TOURS: dict[str, list[tuple[list[str], str]]] = {
    "TOUR_SOLVE": [(["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "1024",
                     "--response-len", "2048", "-o", "plan.toml"], "output")],
    "TOUR_VALIDATE": [(["import", "verl", "tests/data/verl_scripts/grpo_lora_shell_vars.sh", "--gpu", "h100-80g",
                        "--env", "NGPUS=8", "-o", "imported.toml"], ""),
                      (["validate", "imported.toml"], "output")],
    "TOUR_COMPARE": [(["compare", "qwen2_7b_gsm8k_8gpu_min.sh", "verl_qwen2_7b_min.log", "--gpu", "h100-80g",
                       "--fix", "rollout.enforce_eager=true", "--fix", "critic.use_remove_padding=false"], "command")],
}
# The folder a block's commands run in, said in the block as a `$ cd` line (default: the scratch folder's top).
FOLDERS = {"TOUR_COMPARE": PUBLIC}


def run(args: list[str], folder: Path) -> str:
    """One rlplan command as a user runs it in `folder`, its output as a terminal of TOUR_COLUMNS shows it."""
    env = {**os.environ, "COLUMNS": str(TOUR_COLUMNS), "NO_COLOR": "1", "TERM": "dumb"}
    done = subprocess.run([sys.executable, "-c", "from rlplan.planner.commands.entry import main; main()", *args],
                          cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    return "\n".join(line.rstrip() for line in done.stdout.splitlines()) + "\n"


def block(marker: str) -> str:
    """The text a marker's block holds today."""
    with tempfile.TemporaryDirectory(prefix="rlplan-tour-") as scratch:
        folder = Path(scratch)
        for data in ("tests/data/verl_scripts", PUBLIC):
            shutil.copytree(ROOT / data, folder / data)
        shown = [f"$ cd {FOLDERS[marker]}\n"] if marker in FOLDERS else []
        for args, show in TOURS[marker]:
            output = run(args, folder / FOLDERS.get(marker, ""))
            if show:
                shown.append((f"$ rlplan {' '.join(args)}\n" if show == "command" else "") + output)
        return "".join(shown)


def fenced(marker: str, text: str) -> str:
    return f"<!-- {marker} -->\n```\n{text}```\n"


def rewritten(readme: str, blocks: dict[str, str]) -> str:
    """README with each marker's fenced block replaced by its text."""
    for marker, text in blocks.items():
        found = re.search(rf"<!-- {marker} -->\n```\n.*?```\n", readme, re.S)
        if found is None:
            raise SystemExit(f"README.md has no `<!-- {marker} -->` followed by a fenced block")
        readme = readme[:found.start()] + fenced(marker, text) + readme[found.end():]
    return readme


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md's tour blocks")
    args = parser.parse_args()
    readme = README.read_text(encoding="utf-8")
    fresh = rewritten(readme, {marker: block(marker) for marker in TOURS})
    if args.write:
        README.write_text(fresh, encoding="utf-8")
        return 0
    if fresh == readme:
        print("README.md's tour is current")
        return 0
    sys.stdout.writelines(difflib.unified_diff(readme.splitlines(True), fresh.splitlines(True), "README.md",
                                               "README.md (regenerated)"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
