"""How a test process ends: its verdict is pytest's, never what native libraries do while the interpreter exits.

A test process of the runtime suite hosts dozens of vLLM engines, compiled graphs, gloo groups and Ray drivers in
turn. Twice a CI run passed every test and then died on SIGSEGV after pytest's summary, during interpreter exit
(exit -11, no Python stack: the crash came after faulthandler had been torn down, in a native library's exit-time
destructors). The first cause was found and fixed (oneDNN handles of vLLM's CPU linears freed at exit, see
`runtime/rollout/engine.py`); the second, on another CPU, left nothing to read. So once pytest has finished and
reported, the process runs Python's exit handlers and leaves with pytest's own exit status, without the native
teardown that can only turn a verdict into a crash. What the runtime's own commands do at exit stays under test:
`rlplan run` and `rlplan demo` run as subprocesses whose exit codes the tests and the wheel session check.
"""

from __future__ import annotations

import atexit
import os
import sys

import pytest


def _release_what_a_test_left_running() -> None:
    """Ray drivers and process groups a failed test may have left: closed while their libraries are whole."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


_SESSION = pytest.StashKey[pytest.Session]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[_SESSION] = session


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or _SESSION not in config.stash:
        return  # an xdist worker answers to its controller; a run that never started a session exits as usual
    status = int(config.stash[_SESSION].exitstatus)
    try:
        _release_what_a_test_left_running()
    except Exception as error:  # noqa: BLE001 - the verdict stands; say what could not be closed
        print(f"tests/conftest.py: could not close what a test left running: {error!r}", file=sys.stderr)
    atexit._run_exitfuncs()  # pytest's own (its tmp_path locks), logging's, the libraries' Python handlers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
