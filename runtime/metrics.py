"""Per-step metrics: measured on the workers, written by the controller.

`metrics.jsonl` in the run's output directory gets one JSON object per step,
flushed as it is written, so a killed run keeps every finished step. The same
numbers go to the trackers the plan's `trainer.logger` names (verl's key): a rich
console line, TensorBoard (torch's SummaryWriter), Weights & Biases and MLflow,
each through its own library (the optional extras `tensorboard`, `wandb`,
`mlflow`). A tracker whose library is missing is refused before the run starts
(`check_trackers`), never skipped. W&B writes under the run directory and honours
`WANDB_MODE=offline`; MLflow writes to `MLFLOW_TRACKING_URI` when set, else to a
file store at `<run dir>/mlruns`.

Memory per phase is measured where it is spent: on GPU as
`torch.cuda.max_memory_allocated` over the phase, and beside it what the process
held at that peak (`memory/<phase>_held_gib`: the caching allocator's reserved
peak plus the CUDA context and NCCL buffers the driver counts for the process,
which is what `rlplan calibrate --from-run` fits the allocator model to); on CPU,
where PyTorch keeps no allocator statistics, as the peak resident set size of the
worker process (the kernel's VmHWM mark, reset as the phase starts; sampled every
2 ms where it cannot be reset; the label keeps its older name for the metrics files
written before). The label travels with the number (`memory_measure`), because RSS
includes the interpreter and libraries and is not comparable with a GPU allocator peak.
"""

from __future__ import annotations

import abc
import functools
import importlib.util
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.phases import ControllerWork, Phase

if TYPE_CHECKING:
    from rich.console import Console

    from rlplan.planner.plan import Plan
    from rlplan.planner.profile import Profile

METRICS_FILE = "metrics.jsonl"
GPU_MEASURE = "cuda_max_memory_allocated"
CPU_MEASURE = "cpu_process_rss_sampled_peak"
HELD_MEASURE = "cuda_memory_held"
# What a measured piece of work returns.
T = TypeVar("T")
# The phases and the controller's work between them, in the order a step's record shows them.
STEP_ORDER: tuple[Phase | ControllerWork, ...] = (
    Phase.ROLLOUT, ControllerWork.REWARD, Phase.OLD_LOG_PROB, Phase.REF_LOG_PROB, Phase.CRITIC_VALUES,
    ControllerWork.ADVANTAGES, Phase.CRITIC_UPDATE, Phase.ACTOR_UPDATE, Phase.WEIGHT_SYNC,
)
_STEP_POSITION: dict[str, int] = {name: position for position, name in enumerate(STEP_ORDER)}


def _rss_and_mapped_bytes() -> tuple[int, int]:
    """(resident bytes, of them the pages backed by a file or shared memory: RssFile + RssShmem) of this process.

    The rest (RssAnon) is the heap: the interpreter's objects, glibc's arenas, torch's tensors. The mapped part
    is mostly shared libraries' code and data, which differs between CPUs by the code paths their ISA takes.
    """
    with open("/proc/self/statm") as handle:
        fields = handle.read().split()
    page = os.sysconf("SC_PAGE_SIZE")
    return int(fields[1]) * page, int(fields[2]) * page


def _reset_peak_rss() -> bool:
    """Set the kernel's peak resident-set mark of this process (VmHWM) back to its resident set now.

    Writing 5 to /proc/self/clear_refs does it (Linux >= 4.0, proc(5)); False where the kernel or a sandbox
    refuses the write. The mark is exact (a spike shorter than any sampling interval counts, as glibc's mmap'd
    temporaries returned at free are) and costs the phase nothing.
    """
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return _peak_rss_bytes() is not None


def _peak_rss_bytes() -> int | None:
    """VmHWM of /proc/self/status: the largest resident set since the process started or the mark was reset."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def held_at_peak(max_reserved_bytes: int, reserved_now_bytes: int, process_used_now_bytes: int) -> int:
    """GPU bytes the process held at its allocator peak.

    The driver's per-process figure includes the CUDA context, cuBLAS and NCCL buffers, which
    the allocator does not see; they do not change during a phase, so what the process holds
    beyond its reserved pool now is added to the pool's peak.
    """
    non_allocator = max(0, process_used_now_bytes - reserved_now_bytes)
    return max_reserved_bytes + non_allocator


@functools.cache
def _nvml_device(device_index: int) -> Any:
    """NVML's handle of a CUDA device, or None without NVML; initialised once per process."""
    import torch

    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except pynvml.NVMLError:
        return None


def _process_gpu_bytes() -> int | None:
    """What the driver counts for this process on its current GPU, or None where NVML cannot tell.

    NVML (nvidia-ml-py, which torch's CUDA builds use for `torch.cuda.list_gpu_processes`) lists
    processes by pid; inside a PID namespace the pids differ and the figure is unavailable.
    """
    import pynvml
    import torch

    handle = _nvml_device(torch.cuda.current_device())
    if handle is None:
        return None
    try:
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and process.usedGpuMemory is not None:
                return int(process.usedGpuMemory)
    except pynvml.NVMLError:
        return None
    return None


class PeakMemoryProbe:
    """Peak memory over a `with` block, by the best measure this device offers.

    On a CPU the peak is the kernel's mark of the largest resident set (VmHWM, reset when the block starts):
    exact, and nothing runs beside the phase. A thread sampling the resident set every 2 ms, its fallback where
    the mark cannot be reset (or a probe is already open in this process, whose mark it would erase), missed
    spikes shorter than its interval (tests/runtime/test_metrics.py holds the mark to one such spike) and woke
    the process it watched every 2 ms, taking the GIL from the engine's Python loop (issue 42).
    """

    # Probes open in this process that reset the kernel's mark: a second one must not reset it again.
    _open_marks = 0
    _marks_lock = threading.Lock()

    def __init__(self, device_type: str, interval_s: float = 0.002) -> None:
        self.device_type = device_type
        self.interval_s = interval_s
        self.peak_bytes = 0
        # CPU only: the file-backed and shared pages (RssFile + RssShmem) of the resident set at its peak (with
        # the kernel's mark: the larger of the phase's start and end; these pages move little within a phase).
        self.mapped_bytes: int | None = None
        # GPU only: what the process held at the allocator peak (None where NVML cannot tell).
        self.held_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._uses_mark = False

    @property
    def measure(self) -> str:
        return GPU_MEASURE if self.device_type == "cuda" else CPU_MEASURE

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(self.interval_s)

    def _take(self) -> None:
        resident, mapped = _rss_and_mapped_bytes()
        if resident >= self.peak_bytes:
            self.peak_bytes, self.mapped_bytes = resident, mapped

    def _open_mark(self) -> bool:
        with PeakMemoryProbe._marks_lock:
            if PeakMemoryProbe._open_marks or not _reset_peak_rss():
                return False
            PeakMemoryProbe._open_marks += 1
            return True

    def __enter__(self) -> PeakMemoryProbe:
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return self
        self._take()
        self._uses_mark = self._open_mark()
        if not self._uses_mark:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize()
            self.peak_bytes = int(torch.cuda.max_memory_allocated())
            process_used = _process_gpu_bytes()
            if process_used is not None:
                self.held_bytes = held_at_peak(
                    int(torch.cuda.max_memory_reserved()), int(torch.cuda.memory_reserved()), process_used
                )
            return
        if self._uses_mark:
            mapped_at_start = self.mapped_bytes or 0
            self._take()
            self.peak_bytes = max(self.peak_bytes, _peak_rss_bytes() or 0)
            self.mapped_bytes = max(mapped_at_start, self.mapped_bytes or 0)
            with PeakMemoryProbe._marks_lock:
                PeakMemoryProbe._open_marks -= 1
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()


@frozen(kw_only=True)
class PhaseMeasurement:
    """One phase on one worker: wall seconds and peak bytes."""

    seconds: float
    peak_bytes: int
    measure: str
    held_bytes: int | None = None
    # CPU only: the file-backed and shared part of the peak resident set (the rest is the heap).
    mapped_bytes: int | None = None


def measured(device_type: str, work: Callable[[], T]) -> tuple[T, PhaseMeasurement]:
    """Run `work()` under a timer and a memory probe."""
    probe = PeakMemoryProbe(device_type)
    start = time.perf_counter()
    with probe:
        result = work()
    return result, PhaseMeasurement(
        seconds=time.perf_counter() - start, peak_bytes=probe.peak_bytes, measure=probe.measure, held_bytes=probe.held_bytes,
        mapped_bytes=probe.mapped_bytes,
    )


def _finite(value: Any) -> Any:
    """JSON has no NaN: non-finite floats are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """The run's metrics sink: metrics.jsonl, then each tracker of the plan's trainer.logger."""

    def __init__(self, output_dir: str | os.PathLike[str], *, resume: bool = False,
                 trackers: tuple[Tracker, ...] = ()) -> None:
        self.path = Path(output_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a" if resume else "w", encoding="utf-8")
        self.trackers = trackers

    def write(self, record: dict[str, Any]) -> None:
        if "step" not in record:
            raise ValueError("a metrics record needs its step")
        clean = {key: _finite(value) for key, value in record.items()}
        self._file.write(json.dumps(clean, sort_keys=True) + "\n")
        self._file.flush()
        scalars = {key: float(value) for key, value in clean.items()
                   if isinstance(value, int | float) and not isinstance(value, bool) and key != "step"}
        for tracker in self.trackers:
            tracker.log(record, scalars, int(record["step"]))

    def close(self) -> None:
        self._file.close()
        for tracker in self.trackers:
            tracker.close()


# --- experiment trackers (trainer.logger) ------------------------------------------------------

# Tracker -> (the module it writes through, the pip extra of rlplan that installs it).
TRACKER_LIBRARIES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
                     "mlflow": ("mlflow", "mlflow")}
RUNTIME_TRACKERS = ("console", *TRACKER_LIBRARIES)


class Tracker(abc.ABC):
    """One destination of the per-step numbers; each tracker of trainer.logger says how it logs a step."""

    @abc.abstractmethod
    def log(self, record: dict[str, Any], scalars: dict[str, float], step: int) -> None:
        """Write one step: the whole record (console) or its scalars (the libraries)."""

    def close(self) -> None:  # noqa: B027 - a deliberate no-op default, not an abstract method
        """Nothing to release unless the tracker holds a writer or a remote run."""


class ConsoleTracker(Tracker):
    def __init__(self, console: Console) -> None:
        self.console = console

    def log(self, record: dict[str, Any], scalars: dict[str, float], step: int) -> None:
        self.console.print(console_line(record))


class TensorBoardTracker(Tracker):
    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory))

    def log(self, record: dict[str, Any], scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _run_id(output_dir: Path, name: str, resume: bool, new_id: Callable[[], object]) -> str:
    """The tracker's run id, kept in the run directory so `rlplan run --resume` continues the same run."""
    path = output_dir / f"{name}-run-id"
    if resume and path.exists():
        return path.read_text().strip()
    run_id = str(new_id())
    path.write_text(run_id + "\n")
    return run_id


class WandbTracker(Tracker):
    """W&B through `wandb`; WANDB_MODE=offline keeps the run under <run dir>/wandb for `wandb sync`."""

    def __init__(self, output_dir: Path, project: str, name: str, config: dict[str, Any], resume: bool) -> None:
        import wandb

        run_id = _run_id(output_dir, "wandb", resume, lambda: uuid.uuid4().hex[:12])
        self.run = wandb.init(project=project, name=name, id=run_id, resume="allow", dir=str(output_dir),
                              config=config, reinit="create_new")

    def log(self, record: dict[str, Any], scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step, commit=True)  # a killed run keeps every finished step

    def close(self) -> None:
        self.run.finish()


# MLflow takes at most 100 params per batch call (MAX_PARAMS_TAGS_PER_BATCH).
MLFLOW_PARAMS_PER_BATCH = 100


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


class MlflowTracker(Tracker):
    """MLflow through its client; a file store under the run directory unless MLFLOW_TRACKING_URI says otherwise."""

    def __init__(self, output_dir: Path, project: str, name: str, config: dict[str, Any], resume: bool) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # The offline default: a file store in the run directory. MLflow 3 keeps that backend in
            # maintenance mode and refuses it unless opted in; a database or a server is one
            # MLFLOW_TRACKING_URI away (sqlite:///mlflow.db needs the full `mlflow` package).
            uri = (output_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(project)
        fresh: list[str] = []

        def create() -> str:
            fresh.append(self.client.create_run(experiment_id, run_name=name).info.run_id)
            return fresh[0]

        self.run_id = _run_id(output_dir, "mlflow", resume, create)
        if fresh:
            params = [Param(key, value) for key, value in _flatten(config).items()]
            for start in range(0, len(params), MLFLOW_PARAMS_PER_BATCH):
                self.client.log_batch(self.run_id, params=params[start:start + MLFLOW_PARAMS_PER_BATCH])

    def log(self, record: dict[str, Any], scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, step) for key, value in scalars.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def check_trackers(loggers: tuple[str, ...]) -> None:
    """Refuse, before a run starts, a tracker this runtime does not write or whose library is missing."""
    unsupported = [name for name in loggers if name not in RUNTIME_TRACKERS]
    if unsupported:
        raise PlanError(
            field="trainer.logger",
            message=f"names {', '.join(unsupported)}, which verl writes but rlplan's runtime does not "
                    f"(it writes {', '.join(RUNTIME_TRACKERS)}).",
            fix=f"remove {', '.join(unsupported)} from trainer.logger to run the plan with `rlplan run`",
        )
    missing = [name for name in loggers
               if name in TRACKER_LIBRARIES and importlib.util.find_spec(TRACKER_LIBRARIES[name][0]) is None]
    if missing:
        extras = ",".join(TRACKER_LIBRARIES[name][1] for name in missing)
        raise PlanError(
            field="trainer.logger",
            message=f"names {', '.join(missing)}, but the {' and '.join(TRACKER_LIBRARIES[n][0] for n in missing)} "
                    f"package{'s are' if len(missing) > 1 else ' is'} not installed, so the run would log nowhere there.",
            fix=f"pip install -e '.[{extras}]' in the rlplan clone (or '.[trackers]' for all), or remove "
                f"{', '.join(missing)} from trainer.logger",
        )


def open_trackers(plan: Plan, output_dir: str | os.PathLike[str], console: Console | None, *, resume: bool) -> tuple[Tracker, ...]:
    """The trackers of `plan.trainer.logger`, in its order (check_trackers has passed)."""
    from rlplan.planner.planfile import plan_to_dict

    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    trainer = plan.trainer
    trackers: list[Tracker] = []
    for name in dict.fromkeys(trainer.logger):
        if name == "console":
            if console is not None:
                trackers.append(ConsoleTracker(console))
        elif name == "tensorboard":
            trackers.append(TensorBoardTracker(directory / "tensorboard"))
        elif name == "wandb":
            trackers.append(WandbTracker(directory, trainer.project_name, trainer.experiment_name,
                                         plan_to_dict(plan), resume))
        elif name == "mlflow":
            trackers.append(MlflowTracker(directory, trainer.project_name, trainer.experiment_name,
                                          plan_to_dict(plan), resume))
        else:
            check_trackers((name,))
    return tuple(trackers)


def console_line(record: dict[str, Any]) -> str:
    """The step's headline numbers on one line (rich markup)."""

    def number(key: str, fmt: str) -> str:
        value = record.get(key)
        return format(value, fmt) if isinstance(value, (int, float)) and math.isfinite(value) else "-"

    return (
        f"[bold]step {record['step']}[/bold]  reward {number('reward_mean', '.3f')}  "
        f"sync gap {number('sync_logprob_gap', '.4f')}  kl {number('kl_ref', '.4f')}  "
        f"entropy {number('entropy', '.3f')}  clip {number('actor/clip_fraction', '.3f')}  "
        f"grad {number('actor/grad_norm', '.3f')}  len {number('response_length_mean', '.1f')}  "
        f"step {number('time/step', '.2f')}s"
    )


def read_metrics(output_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = Path(output_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- plan versus actual -----------------------------------------------------------------------


def predicted_phase_peaks(plan: Plan, profile: Profile | None = None) -> dict[str, float]:
    """The planner's predicted per-GPU (per-process on CPU) peak per phase in GiB, when the memory model is
    available.

    Priced with the head this runtime runs (the chunked lean head), not the one verl would run for the
    plan, so plan-vs-actual and `calibrate --from-run` compare like with like; the runtime loads the policy
    in fp32, as verl's default actor.model_dtype prices it. An on-policy step never runs the old-log-prob
    pass here (it reuses the update's own log-probs), so that phase has no prediction to compare.
    """
    try:
        from rlplan.planner.layout import reuses_update_log_probs
        from rlplan.planner.memory import predict_memory
        from rlplan.planner.profile import DEFAULT_PROFILE
        from rlplan.runtime.measure import with_runtime_head
    except ImportError:
        return {}
    skipped = {Phase.OLD_LOG_PROB.value} if reuses_update_log_probs(plan) else set()
    phases = predict_memory(with_runtime_head(plan), profile or DEFAULT_PROFILE).phases
    return {phase.name: phase.peak_bytes / 2**30 for phase in phases if phase.name not in skipped}


# How far a CPU run's prediction may sit from its measured RSS, as (predicted - measured) / measured: under-
# predicting is the costly error (an OOM), so at most 5 % under; at most 25 % over. It holds with the baselines
# `rlplan calibrate --cpu` measured on the machine (planner/memory/cpu_process.py); with the built-in bounds, set
# at the highest baseline seen, a machine whose own is lower is over by the difference, so only the under side
# is held (PREDICTION_BOUND_BUILT_IN). tests/runtime/test_demo.py holds the demo and a plan of another shape to it.
PREDICTION_BOUND: tuple[float, float | None] = (-0.05, 0.25)
PREDICTION_BOUND_BUILT_IN: tuple[float, float | None] = (-0.05, None)


def prediction_bound(profile: Profile) -> tuple[float, float | None]:
    """The bound a CPU run's prediction is held to: PREDICTION_BOUND with measured baselines, else the under side."""
    from rlplan.planner.memory.cpu_process import cpu_baselines

    return PREDICTION_BOUND if cpu_baselines(profile).measured else PREDICTION_BOUND_BUILT_IN


def prediction_error(predicted_gib: float | None, measured_gib: float | None) -> float | None:
    """(predicted - measured) / measured: negative when the plan under-predicted; None without both."""
    if predicted_gib is None or not measured_gib:
        return None
    return (predicted_gib - measured_gib) / measured_gib


def prediction_verdict(error: float | None, bound: tuple[float, float | None] = PREDICTION_BOUND) -> str:
    if error is None:
        return "-"
    low, high = bound
    if error < low:
        return "UNDER-predicted"
    return "over, beyond the bound" if high is not None and error > high else "holds"


def plan_versus_actual(predicted_gib: dict[str, float], measured_bytes: dict[str, int], measure: str,
                       bound: tuple[float, float | None] = PREDICTION_BOUND) -> list[dict[str, Any]]:
    """Rows of (phase, predicted GiB, measured GiB, error, verdict) over every phase either side knows."""
    rows = []
    for phase in sorted(set(predicted_gib) | set(measured_bytes), key=lambda p: (_STEP_POSITION.get(p, len(STEP_ORDER)), p)):
        measured_gib = measured_bytes[phase] / 2**30 if phase in measured_bytes else None
        error = prediction_error(predicted_gib.get(phase), measured_gib)
        rows.append(
            {
                "phase": phase,
                "predicted_gib": predicted_gib.get(phase),
                "measured_gib": measured_gib,
                "measure": measure,
                "error": error,
                # The bound is the CPU runtime's (a process's whole RSS); on a GPU the allocator's peak leaves out
                # the CUDA context and NCCL that the prediction includes, so no verdict is given there.
                "verdict": prediction_verdict(error, bound) if measure == CPU_MEASURE else "-",
                "bound": list(bound),
            }
        )
    return rows


def plan_versus_actual_table(rows: list[dict[str, Any]]) -> Any:
    from rlplan.planner.tables import FittedTable

    measure = rows[0]["measure"] if rows else ""
    table = FittedTable(title=f"Plan versus actual: peak memory per phase (measured: {measure})")
    table.add_column("phase")
    # On CPU the planner prices each phase as the resident set of the process that runs it, not a GPU.
    per = "per process" if measure.startswith("cpu") else "per GPU"
    table.add_column(f"predicted GiB ({per})", justify="right")
    table.add_column("measured GiB", justify="right")
    table.add_column("error", justify="right")
    table.add_column("verdict")
    for row in rows:
        error = prediction_error(row["predicted_gib"], row["measured_gib"])
        table.add_row(
            row["phase"],
            "-" if row["predicted_gib"] is None else f"{row['predicted_gib']:.2f}",
            "-" if row["measured_gib"] is None else f"{row['measured_gib']:.2f}",
            "-" if error is None else f"{100 * error:+.0f} %",
            row.get("verdict", "-"),
        )
    low, high = rows[0].get("bound", PREDICTION_BOUND) if rows else PREDICTION_BOUND
    within = (f"within {100 * low:+.0f} % to {100 * high:+.0f} %" if high is not None else
              f"from {100 * low:+.0f} % up: the CPU baselines are the built-in bounds, higher than most machines' "
              "(`rlplan calibrate --cpu -o cpu.toml` measures this one's; `rlplan run PLAN --profile cpu.toml`)")
    table.caption = "error = (predicted - measured) / measured" + (
        f"; it holds {within} (under-predicting is the costly side)"
        if measure == CPU_MEASURE else "; the GPU figure is the allocator's peak, without the CUDA context")
    return table
