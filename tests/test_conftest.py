"""tests/conftest.py ends a test process with pytest's own exit status: a failure stays a failure, no tests stays 5."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")


def _pytest_exit_status(tmp_path: Path, test_source: str | None) -> tuple[int, str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    if test_source is not None:
        (tmp_path / "test_sample.py").write_text(test_source)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout


@pytest.mark.parametrize(("source", "status"), [
    ("def test_passes():\n    assert True\n", 0),
    ("def test_fails():\n    assert False\n", 1),
    (None, 5),
    ("import atexit\natexit.register(print, 'exit handler ran')\ndef test_passes():\n    pass\n", 0),
])
def test_the_process_exits_with_pytests_status_after_its_summary(tmp_path, source, status):
    returncode, stdout = _pytest_exit_status(tmp_path, source)
    assert returncode == status, stdout
    if status in (0, 1):
        assert (" passed in " if status == 0 else " failed in ") in stdout  # pytest's summary was printed
    if source and "atexit" in source:
        assert "exit handler ran" in stdout  # Python's exit handlers still run

