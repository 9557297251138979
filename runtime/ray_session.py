"""Ray's worker processes started within a bounded time, or one paragraph saying why they were not.

Ray restarts a worker process that dies at start, silently and forever: the raylet notices only after
`worker_register_timeout_seconds` (60 s by default) and starts another, and a driver waiting on the actor
(`ray.get` without a timeout) waits for ever. Before this module, `rlplan run` did so at "Started a local Ray
instance" when every worker refused its temp dir. Three things keep a run from hanging:

- `check_ray_temp_dir`: the one cause known up front. A worker refuses a temp dir inside the virtualenv root
  named by $VIRTUAL_ENV (Ray 2.60 ray/_private/parameter.py RayParams._check_usage: "temp_dir must not be child
  directory of virtualenv root"), and the temp dir of a local cluster is $RAY_TMPDIR, else $TMPDIR, else /tmp
  (ray/_common/utils.py get_default_system_temp_dir). `nox`'s session.create_tmp() sets TMPDIR inside the
  session's venv, which is how it was met.
- `NO_FIRST_DRIVER_PRESTART`: Ray starts a worker when the first driver connects and does not return from
  `ray.init` until that worker has registered, so with workers that die at start `ray.init` itself blocked in
  C++ holding the GIL (no Python thread could run). Without the prestart `ray.init` returns and the wait moves to
  `wait_for`, which can watch it.
- `wait_for`: waits on actor calls in short slices; between them it reads the raylet's log, and a worker process
  that "crashed during start" (the raylet's words, worker_pool.cc) ends the wait with what the dead worker wrote
  on its stderr (which the raylet collects in raylet.err); a stage that outlasts its deadline ends it too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from rlplan.planner.errors import PlanError

# The raylet's line when a worker process died before it registered (Ray 2.60, raylet worker_pool.cc), and the
# one when it is alive but has not registered yet (slow, or stuck in an import).
CRASHED_AT_START = "probably it crashed during start"
HANGING_AT_START = "probably it's hanging during start"
# ray.init(_system_config=...) of a local cluster: no worker started (and waited for) inside ray.init.
NO_FIRST_DRIVER_PRESTART = {"prestart_worker_first_driver": False}
# How long each start-up stage may take before the run gives up: the trainers load the model and form their
# process group; the engine imports vLLM, loads the model and compiles (a minute or two on 2 busy cores).
STAGE_TIMEOUT_S = float(os.environ.get("RLPLAN_WORKER_START_TIMEOUT_S", "1200"))
POLL_S = 2.0
# Lines of a dead worker's stderr quoted in the error.
QUOTED_LINES = 3


def ray_temp_root(environ: Mapping[str, str]) -> tuple[str, str]:
    """(the variable that names it, the path) of the temp dir a local Ray cluster uses, as Ray picks it."""
    for variable in ("RAY_TMPDIR", "TMPDIR"):
        if environ.get(variable):
            return variable, environ[variable]
    return "", "/tmp"


def check_ray_temp_dir(environ: Mapping[str, str] | None = None) -> None:
    """Refuse a temp dir inside $VIRTUAL_ENV, which every Ray worker refuses at start."""
    environ = os.environ if environ is None else environ
    venv = environ.get("VIRTUAL_ENV")
    variable, temp = ray_temp_root(environ)
    if not venv or not variable:
        return
    if not Path(temp).resolve().is_relative_to(Path(venv).resolve()):
        return
    raise PlanError(
        field=variable,
        message=f"Ray's temp dir {temp} is inside the virtualenv root {venv} ($VIRTUAL_ENV); every Ray worker "
                "process refuses that at start (\"temp_dir must not be child directory of virtualenv root\"), "
                "and the run would wait for workers that never come.",
        fix=f"point {variable} outside the virtualenv (e.g. `export {variable}=/tmp`), or set RAY_TMPDIR to such "
            "a directory",
    )


@frozen
class SessionLogs:
    """The log directory of the Ray session this process started or joined (what the raylet wrote)."""

    directory: Path

    @classmethod
    def of_this_session(cls) -> SessionLogs | None:
        try:
            import ray._private.worker as ray_worker

            node = ray_worker._global_node
            return cls(Path(node.get_session_dir_path()) / "logs") if node is not None else None
        except (AttributeError, ImportError):  # another Ray without these internals: no evidence, deadlines only
            return None

    def _lines(self, name: str) -> list[str]:
        try:
            return (self.directory / name).read_text(errors="replace").splitlines()
        except OSError:
            return []

    def raylet_says(self, phrase: str) -> list[str]:
        return [line for line in self._lines("raylet.out") if phrase in line]

    def dead_workers_wrote(self) -> list[str]:
        """The last lines dying workers wrote to stderr (the raylet's own stderr, raylet.err), tracebacks first."""
        lines = [line.strip() for line in self._lines("raylet.err") if line.strip()]
        # A Python traceback's last line names the exception: that is the cause worth quoting.
        errors = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception"))]
        # Each restarted worker writes the same words: each distinct line once, the latest last.
        distinct = list(dict.fromkeys(reversed(errors or lines)))
        return distinct[:QUOTED_LINES][::-1]


def start_failure(what: str, logs: SessionLogs | None, *, waited_s: float, crashed: bool) -> PlanError:
    """One paragraph: which stage, what Ray's logs say about its workers, where to read more."""
    quoted = logs.dead_workers_wrote() if logs is not None else []
    if crashed:
        message = (f"Ray's worker processes died at start while {what}: the raylet reports each new one "
                   f"\"dead, {CRASHED_AT_START}\", and Ray keeps restarting them, so the run stops here after "
                   f"{waited_s:.0f} s instead of waiting for ever.")
    else:
        hanging = logs is not None and bool(logs.raylet_says(HANGING_AT_START))
        message = (f"{what} did not finish within {waited_s:.0f} s"
                   + (": the raylet reports worker processes alive but never registered (stuck in an import?)."
                      if hanging else "."))
    if quoted:
        message += " The workers wrote: " + " | ".join(quoted)
    where = f" in {logs.directory}" if logs is not None else ""
    return PlanError(
        field="ray workers",
        message=message,
        fix=f"read raylet.err and raylet.out{where} for the cause; the usual ones are an environment the workers "
            "cannot start in (a PYTHONPATH or sitecustomize that fails, a temp dir inside the virtualenv) or a "
            "machine too loaded to start them (raise RLPLAN_WORKER_START_TIMEOUT_S)",
    )


def wait_for(refs: Sequence[Any], what: str, *, logs: SessionLogs | None = None,
             timeout_s: float = STAGE_TIMEOUT_S, poll_s: float = POLL_S) -> list[Any]:
    """`ray.get(refs)`, but a worker that died at start or a stage past `timeout_s` ends it with a PlanError.

    `what` names the stage in the error ("loading the model on 2 trainer ranks"). An actor whose own code
    raised is ready with its error, and ray.get raises it as it would have.
    """
    import ray

    refs = list(refs)
    started = time.monotonic()
    while True:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=poll_s)
        if len(ready) == len(refs):
            return list(ray.get(refs))
        waited = time.monotonic() - started
        if logs is not None and logs.raylet_says(CRASHED_AT_START):
            raise start_failure(what, logs, waited_s=waited, crashed=True)
        if waited > timeout_s:
            raise start_failure(what, logs, waited_s=waited, crashed=False)
