"""Rewrite the example gallery from gallery.toml: `python examples/regenerate.py [NAME ...]`.

Each example is what `rlplan solve` writes today for its flags (after `rlplan import verl` where the entry
imports a verl script), then `rlplan render --target verl`. Run it with rlplan importable (`nox -s env`, or
`pip install -e .`: the planner alone is enough) whenever the solver's defaults change, and commit the diff.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def gallery() -> list[dict[str, Any]]:
    return tomllib.loads((HERE / "gallery.toml").read_text(encoding="utf-8"))["example"]


def rlplan(*args: str | Path) -> None:
    """One rlplan command, as a user types it; its output is shown only when it fails."""
    done = subprocess.run([sys.executable, "-m", "rlplan.planner.commands.cli", *map(str, args)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"rlplan {' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}{done.stderr}")


def regenerate(entry: dict[str, Any], root: Path = HERE) -> Path:
    """Write <root>/<name>/plan.toml and run.sh; returns the folder.

    An imported script is imported into a scratch folder and solved from there: the import is the script as verl
    would run it, which may break verl's rules (the SGLang example's overrides set no micro batch), and a folder
    of ready plans holds only what validates."""
    folder = root / entry["name"]
    folder.mkdir(parents=True, exist_ok=True)
    solve = list(entry["solve"])
    with tempfile.TemporaryDirectory(prefix="rlplan-example-") as scratch:
        if "import_verl" in entry:
            imported = Path(scratch) / "imported.toml"
            rlplan("import", "verl", HERE / entry["import_verl"], *entry.get("import_args", []), "-o", imported)
            solve += ["--from", imported]
        rlplan("solve", *solve, "--quiet", "-o", folder / "plan.toml")
    rlplan("render", folder / "plan.toml", "--target", "verl", "-o", folder / "run.sh")
    return folder


README_HEAD = """# Example gallery

Ready plans and verl launch scripts for common workloads, each one `rlplan solve` away (the command is in
[gallery.toml](gallery.toml)). Start from the closest one:

```bash
cp -r examples/grpo-gsm8k-qwen2.5-7b-8xh100 my-run
rlplan explain my-run/plan.toml                        # where the memory goes, phase by phase
rlplan solve --from my-run/plan.toml --gpus 16 -o my-run/plan.toml   # the same workload on other hardware
rlplan render my-run/plan.toml --target verl -o my-run/run.sh && bash my-run/run.sh
```

Data paths are verl's defaults (`~/data/gsm8k/*.parquet`, `~/data/math/*.parquet`, made by verl's
`examples/data_preprocess` scripts): pass `--train-files` / `--val-files` to point elsewhere. After a change to
the solver, `python examples/regenerate.py` rewrites every example (tests/planner/test_examples.py checks that
each one validates, fits and renders).

| example | what |
|---|---|
"""


def readme(entries: list[dict[str, Any]]) -> str:
    return README_HEAD + "".join(f"| [{e['name']}]({e['name']}/) | {e['what']} |\n" for e in entries)


def main(names: list[str]) -> None:
    entries = gallery()
    unknown = set(names) - {entry["name"] for entry in entries}
    if unknown:
        sys.exit(f"not in gallery.toml: {', '.join(sorted(unknown))}")
    for entry in entries:
        if not names or entry["name"] in names:
            print(f"{regenerate(entry).relative_to(HERE.parent)}: {entry['what']}")
    (HERE / "README.md").write_text(readme(entries), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
