"""Fixtures the runtime tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The bundled tiny Qwen2, built once per session (a few seconds) and read-only afterwards."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")  # the trainer tests that take this model wrap it with LoRA
    from rlplan.runtime.tiny import ensure_tiny_model

    return str(ensure_tiny_model(tmp_path_factory.getbasetemp() / "tiny-model"))
