"""`rlplan import verl` on every launch script a verl checkout ships (issue 44): how many reach a verdict.

    python benchmarks/verl_shipped_scripts.py CHECKOUT [CHECKOUT ...]            # the table, per checkout
    python benchmarks/verl_shipped_scripts.py CHECKOUT --details                 # and one line per script
    python benchmarks/verl_shipped_scripts.py CHECKOUT --json                    # every row as JSON
    python benchmarks/verl_shipped_scripts.py CHECKOUT ... --write docs/verl-shipped-scripts.md   # the page, in place

A CHECKOUT is the root of a verl source tree at one release; none is committed here (it is verl's code). Get one
from a clone of https://github.com/volcengine/verl:

    git clone https://github.com/volcengine/verl verl && git -C verl worktree add ../verl-v0.4.1 v0.4.1
    # or, from any clone or bare mirror:  git --git-dir=verl/.git archive v0.4.1 | tar -x -C verl-v0.4.1

The launch scripts are the `*.sh` files under the checkout's `examples/` and `recipe/` whose text runs
`-m verl.trainer.main_ppo` or a `-m recipe.<name>.<module>` trainer (SFT, generation, evaluation and data
preparation modules are not RL launches and are left out). Each is imported as a new user would, from the
checkout's root: `rlplan import verl <script> --gpu h100-80g -o plan.toml`, then `rlplan validate plan.toml`, both
in process through the CLI (the same code paths, exit codes and messages), with the process environment as it is.

Every script lands in one column:
- fits / OOM: validate ran the memory model and said so (exit 0 / 1): a verdict.
- cannot run as shipped: the import refused, saying why the script as shipped fails wherever it runs, with the
  reason in verl's, bash's or Hydra's own behaviour (a placeholder or empty model path, which verl's main_ppo loads
  the tokenizer from first; a backslash-space that ends the command): a verdict too.
- refused by rule: the plan reached validate, whose rules refuse it (exit 2); the rules are named. Each rule fires
  only on the releases whose own code (or vLLM's or Megatron-Core's under it) refuses the config (issue 36), so a
  script here fails on its own release: docs/verl-shipped-scripts.md lists the code that refuses each.
- the import refused (exit 2), never reaching the memory model, with its reason, in three kinds:
  - needs input: the script as shipped cannot run: a value a priced key needs that nothing sets (the refusal
    names the variable and the --env or --arg that sets it), a placeholder or local model path that is not on
    this machine, a hub model found nowhere offline (the refusal gives the `hf download` command), no model at
    all, a blank argument Hydra refuses;
  - not modeled: a model, engine or recipe placement rlplan refuses by name;
  - other: anything else.
  Exit 3 (a bug) is counted apart.
While the scripts are read, every way Python has to start a process (subprocess, os.system, os.exec*, os.spawn*,
os.posix_spawn, os.fork) is replaced by a recorder: the import must run no command, and the table says how many
it tried (0).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
from attrs import frozen
from typer.testing import CliRunner

from rlplan.planner.commands.cli import app
from rlplan.planner.verl_import import CANNOT_RUN_AS_SHIPPED

# benchmarks/ is no package: its shared helpers are imported from beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sections import print_or_write_section  # noqa: E402

GPU = "h100-80g"
_LAUNCH = re.compile(r"-m\s+(verl\.trainer\.main_ppo|recipe\.[A-Za-z0-9_.]+)\b")
_NOT_RL = re.compile(r"sft|generation|eval|data_process|preprocess")


@frozen
class Outcome:
    script: str
    column: str  # "fits", "oom", "shipped", "rule", "input", "unmodeled", "import", "bug"
    reason: str


# What an import refusal says, by kind (the messages of planner/verl_import.py and planner/presets.py).
_NEEDS_INPUT = ("rlplan runs no command and reads no variable", "is not on this machine", "hf download",
                "does not say which model", "only whitespace")
_NOT_MODELED = ("is not supported", "does not model that", "does not model the", "is not one of its allowed values")


def _import_column(reason: str) -> str:
    if CANNOT_RUN_AS_SHIPPED in reason:
        return "shipped"
    if any(marker in reason for marker in _NEEDS_INPUT):
        return "input"
    if any(marker in reason for marker in _NOT_MODELED):
        return "unmodeled"
    return "import"


def launch_scripts(checkout: Path) -> list[Path]:
    """The RL launch scripts under examples/ and recipe/, sorted."""
    found = []
    for folder in ("examples", "recipe"):
        for path in sorted((checkout / folder).rglob("*.sh")):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            modules = [match.group(1) for match in _LAUNCH.finditer(text)]
            if any(not _NOT_RL.search(module) for module in modules):
                found.append(path)
    return found


class CommandAttempted(RuntimeError):
    pass


@contextlib.contextmanager
def no_commands(attempts: list[str]) -> Iterator[None]:
    """Every process-starting call of subprocess and os recorded in `attempts` and refused, while inside."""
    names = ["system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp",
             *(name for name in dir(os) if name.startswith(("exec", "spawn")))]
    saved = {name: getattr(os, name) for name in names if hasattr(os, name)}
    saved_popen = subprocess.Popen

    def refuse(name: str):
        def recorder(*args, **kwargs):
            attempts.append(f"{name}{args[:2]!r}")
            raise CommandAttempted(name)
        return recorder

    class RefusedPopen:
        def __init__(self, *args, **kwargs):
            attempts.append(f"subprocess.Popen{args[:1]!r}")
            raise CommandAttempted("subprocess.Popen")

    try:
        for name in saved:
            setattr(os, name, refuse(f"os.{name}"))
        subprocess.Popen = RefusedPopen  # type: ignore[misc, assignment]
        yield
    finally:
        for name, function in saved.items():
            setattr(os, name, function)
        subprocess.Popen = saved_popen  # type: ignore[misc]


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines)[:400] if lines else ""


def _json_object(text: str) -> dict:
    start = text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else {}
    except ValueError:
        return {}


def run_one(runner: CliRunner, checkout: Path, script: Path, plan_path: Path) -> Outcome:
    relative = str(script.relative_to(checkout))
    imported = runner.invoke(app, ["import", "verl", relative, "--gpu", GPU, "-o", str(plan_path), "--json"])
    if imported.exit_code != 0:
        body = _json_object(imported.stdout)
        error = body.get("error", body)
        reason = (f"{error.get('field', '')}: {error.get('message', '')}" if isinstance(error, dict) and error
                  else _first_line(imported.output))
        column = "bug" if imported.exit_code == 3 or imported.exception and not isinstance(
            imported.exception, SystemExit) else _import_column(reason + " " + str(error.get("fix", "")
                                                                                  if isinstance(error, dict) else ""))
        if column == "bug" and imported.exception is not None:
            reason = f"{type(imported.exception).__name__}: {imported.exception}"
        return Outcome(relative, column, reason)
    checked = runner.invoke(app, ["validate", str(plan_path), "--json"])
    body = _json_object(checked.stdout)
    if checked.exit_code == 0:
        return Outcome(relative, "fits", "")
    if checked.exit_code == 1:
        return Outcome(relative, "oom", str(body.get("verdict", ""))[:200])
    if checked.exit_code == 2:
        names = sorted({str(v.get("rule", "?")) for v in body.get("errors", []) if isinstance(v, dict)})
        return Outcome(relative, "rule", ", ".join(names) or _first_line(checked.output))
    return Outcome(relative, "bug", f"validate exit {checked.exit_code}: {_first_line(checked.output)}")


def run_checkout(checkout: Path) -> tuple[list[Outcome], list[str]]:
    checkout = checkout.resolve()
    runner = CliRunner()
    attempts: list[str] = []
    outcomes = []
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="rlplan-verl-scripts-") as scratch:
        plan_path = Path(scratch) / "plan.toml"
        try:
            os.chdir(checkout)
            with no_commands(attempts):
                for script in launch_scripts(checkout):
                    plan_path.unlink(missing_ok=True)
                    outcomes.append(run_one(runner, checkout, script, plan_path))
        finally:
            os.chdir(cwd)
    return outcomes, attempts


def _reason_class(reason: str) -> str:
    """A refusal's reason with the script's own names taken out, to count alike reasons together."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\$\([^)]*\)|\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*", "…", reason)
    text = re.sub(r"\b[\w./-]*[/.][\w./-]+\b", "…", text)
    text = re.sub(r"\d+", "N", text)
    return text[:160]


def _share(count: int, total: int) -> str:
    return f"{count} ({100 * count / total:.0f} %)" if total else "0"


def _row(label: str, count: collections.Counter[str], commands: int) -> str:
    total = sum(count.values())
    verdict = count["fits"] + count["oom"] + count["shipped"]
    return (f"| {label} | {total} | {count['fits']} | {count['oom']} | {count['shipped']} | {_share(verdict, total)} "
            f"| {count['rule']} | "
            f"{_share(verdict + count['rule'], total)} | {count['input']} | {count['unmodeled']} | {count['import']} "
            f"| {count['bug']} | {commands} |")


def table(results: dict[str, tuple[list[Outcome], list[str]]]) -> str:
    lines = ["| checkout | scripts | fits | OOM | cannot run as shipped | verdict | refused by rule | "
             "verdict or rule | refused: needs input | refused: not modeled | refused: other | bug | commands run |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    totals: collections.Counter[str] = collections.Counter()
    commands = 0
    for label, (outcomes, attempts) in results.items():
        count = collections.Counter(outcome.column for outcome in outcomes)
        lines.append(_row(label, count, len(attempts)))
        totals.update(count)
        commands += len(attempts)
    if len(results) > 1:
        lines.append(_row("all", totals, commands))
    return "\n".join(lines)


def reasons(results: dict[str, tuple[list[Outcome], list[str]]]) -> str:
    out = []
    for label, (outcomes, _) in results.items():
        for column, title in (("shipped", "cannot run as shipped"), ("input", "refused, needs input"),
                              ("unmodeled", "refused, not modeled"), ("import", "refused, other"), ("rule", "refused by rule"), ("bug", "bug (exit 3)")):
            counter = collections.Counter(_reason_class(o.reason) if column != "rule" else o.reason
                                          for o in outcomes if o.column == column)
            if counter:
                out.append(f"\n{label}, {title}:")
                out.extend(f"  {n:4d}  {reason}" for reason, n in counter.most_common())
    return "\n".join(out)


SECTION_HEADING = "## verl's shipped launch scripts through `rlplan import verl`"


def section(results: dict[str, tuple[list[Outcome], list[str]]], checkouts: list[Path]) -> str:
    """The page's section: what was run, the table, and every refusal's reason, counted."""
    versions = ", ".join(f"{path.name} ({_version_file(path)})" for path in checkouts)
    return "\n".join([
        SECTION_HEADING, "",
        "Generated by `python benchmarks/verl_shipped_scripts.py CHECKOUT ... --write docs/verl-shipped-scripts.md` "
        f"on checkouts {versions} (their `verl/version/version`), with `--gpu {GPU}`, from each checkout's root, in "
        "this machine's environment and Hugging Face cache (a model found in neither is refused: the counts move "
        "with them). A verdict is fits, OOM, or cannot run as shipped (a refusal that names why the script fails "
        "wherever it runs); a rule refusal is counted apart. Issue 44 asks for >= 95 % verdicts.", "",
        table(results), "", "What the refusals say, counted (names, paths and numbers taken out):", "", "```",
        reasons(results).strip("\n"), "```", ""])


def _version_file(checkout: Path) -> str:
    path = checkout / "verl" / "version" / "version"
    return path.read_text(encoding="utf-8").strip() if path.is_file() else "no verl/version/version"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkouts", nargs="+", type=Path, help="roots of verl checkouts, one per release")
    parser.add_argument("--details", action="store_true", help="one line per script")
    parser.add_argument("--json", action="store_true", help="every outcome as JSON")
    parser.add_argument("--write", type=Path, default=None, help="markdown page whose section to regenerate")
    args = parser.parse_args(argv)
    results = {}
    for checkout in args.checkouts:
        if not (checkout / "verl").is_dir():
            parser.error(f"{checkout} is not the root of a verl checkout (no verl/ folder)")
        results[checkout.name] = run_checkout(checkout)
    if args.json:
        print(json.dumps({label: {"outcomes": [attrs.asdict(o) for o in outcomes], "commands_attempted": attempts}
                          for label, (outcomes, attempts) in results.items()}, indent=1))
        return 0
    if args.write is not None:
        return print_or_write_section(section(results, args.checkouts), SECTION_HEADING, args.write)
    print(table(results))
    print(reasons(results))
    if args.details:
        for label, (outcomes, _) in results.items():
            print(f"\n{label}:")
            for outcome in outcomes:
                print(f"  {outcome.column:6s} {outcome.script}  {outcome.reason[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
