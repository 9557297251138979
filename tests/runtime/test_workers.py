"""The Ray actors' process settings (runtime/workers.py); the actors themselves run in test_loop."""

from __future__ import annotations

import os

import pytest

from rlplan.runtime.platform import available_cores
from rlplan.runtime.workers import use_every_core


@pytest.mark.runtime
def test_use_every_core_overrides_rays_one_thread_for_the_engine(monkeypatch):
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    # What Ray hands an actor that asks for no CPU.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        use_every_core()
        assert torch.get_num_threads() == available_cores()
        # vLLM keeps an OMP_NUM_THREADS it finds (and otherwise drops to one thread for serving).
        assert os.environ["OMP_NUM_THREADS"] == str(available_cores())
    finally:
        torch.set_num_threads(before)
