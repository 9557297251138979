"""Per-step metrics: measured on the workers, written by the controller.

`metrics.jsonl` in the run's output directory gets one JSON object per step,
flushed as it is written, so a killed run keeps every finished step. The same
numbers go to a rich console line and, when the `tensorboard` package is
installed, to TensorBoard.

Memory per phase is measured where it is spent: on GPU as
`torch.cuda.max_memory_allocated` over the phase, and beside it what the process
held at that peak (`memory/<phase>_held_gib`: the caching allocator's reserved
peak plus the CUDA context and NCCL buffers the driver counts for the process,
which is what `rlplan calibrate --from-run` fits the allocator model to); on CPU, where PyTorch keeps no
allocator statistics, as the peak resident set size of the worker process,
sampled every few milliseconds during the phase. The label travels with the
number (`memory_measure`), because RSS includes the interpreter and libraries
and is not comparable with a GPU allocator peak.
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from attrs import frozen

METRICS_FILE = "metrics.jsonl"
GPU_MEASURE = "cuda_max_memory_allocated"
CPU_MEASURE = "cpu_process_rss_sampled_peak"
HELD_MEASURE = "cuda_memory_held"
# What a measured piece of work returns.
T = TypeVar("T")
# The planner's phase names (planner.memory), in step order.
PHASES = ("rollout", "reward", "old_log_prob", "ref_log_prob", "critic_values", "advantages", "critic_update", "actor_update", "weight_sync")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


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
    """Peak memory over a `with` block, by the best measure this device offers."""

    def __init__(self, device_type: str, interval_s: float = 0.002) -> None:
        self.device_type = device_type
        self.interval_s = interval_s
        self.peak_bytes = 0
        # GPU only: what the process held at the allocator peak (None where NVML cannot tell).
        self.held_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def measure(self) -> str:
        return GPU_MEASURE if self.device_type == "cuda" else CPU_MEASURE

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, _rss_bytes())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakMemoryProbe:
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self.peak_bytes = _rss_bytes()
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
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self.peak_bytes = max(self.peak_bytes, _rss_bytes())


@frozen(kw_only=True)
class PhaseMeasurement:
    """One phase on one worker: wall seconds and peak bytes."""

    seconds: float
    peak_bytes: int
    measure: str
    held_bytes: int | None = None


def measured(device_type: str, work: Callable[[], T]) -> tuple[T, PhaseMeasurement]:
    """Run `work()` under a timer and a memory probe."""
    probe = PeakMemoryProbe(device_type)
    start = time.perf_counter()
    with probe:
        result = work()
    return result, PhaseMeasurement(
        seconds=time.perf_counter() - start, peak_bytes=probe.peak_bytes, measure=probe.measure, held_bytes=probe.held_bytes
    )


def _finite(value: Any) -> Any:
    """JSON has no NaN: non-finite floats are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """The run's metrics sink: metrics.jsonl, the console, TensorBoard when available."""

    def __init__(self, output_dir: str | os.PathLike[str], console: Any = None, *, resume: bool = False) -> None:
        self.path = Path(output_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a" if resume else "w", encoding="utf-8")
        self.console = console
        self._tensorboard = _tensorboard_writer(Path(output_dir) / "tensorboard")

    def write(self, record: dict[str, Any]) -> None:
        if "step" not in record:
            raise ValueError("a metrics record needs its step")
        clean = {key: _finite(value) for key, value in record.items()}
        self._file.write(json.dumps(clean, sort_keys=True) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tensorboard.add_scalar(key, value, record["step"])
            self._tensorboard.flush()
        if self.console is not None:
            self.console.print(console_line(record))

    def close(self) -> None:
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()


def _tensorboard_writer(directory: Path) -> Any:
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(log_dir=str(directory))


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


def predicted_phase_peaks(plan: Any) -> dict[str, float]:
    """The planner's predicted per-GPU peak per phase in GiB, when the memory model is available.

    Priced with the head this runtime runs (naive), not the one verl would run for the plan, so
    plan-vs-actual and `calibrate --from-run` compare like with like.  The runtime loads the policy in
    fp32, as verl's default actor.model_dtype prices it.
    """
    try:
        from rlplan.planner.memory import predict_memory
        from rlplan.runtime.measure import with_runtime_head
    except ImportError:
        return {}
    return {phase.name: phase.peak_bytes / 2**30 for phase in predict_memory(with_runtime_head(plan)).phases}


def plan_versus_actual(predicted_gib: dict[str, float], measured_bytes: dict[str, int], measure: str) -> list[dict[str, Any]]:
    """Rows of (phase, predicted GiB, measured GiB) over every phase either side knows."""
    rows = []
    for phase in sorted(set(predicted_gib) | set(measured_bytes), key=lambda p: (PHASES.index(p) if p in PHASES else 99, p)):
        rows.append(
            {
                "phase": phase,
                "predicted_gib": predicted_gib.get(phase),
                "measured_gib": measured_bytes[phase] / 2**30 if phase in measured_bytes else None,
                "measure": measure,
            }
        )
    return rows


def plan_versus_actual_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    measure = rows[0]["measure"] if rows else ""
    table = Table(title=f"Plan versus actual: peak memory per phase (measured: {measure})")
    table.add_column("phase")
    table.add_column("predicted GiB (per GPU)", justify="right")
    table.add_column("measured GiB", justify="right")
    for row in rows:
        table.add_row(
            row["phase"],
            "-" if row["predicted_gib"] is None else f"{row['predicted_gib']:.2f}",
            "-" if row["measured_gib"] is None else f"{row['measured_gib']:.2f}",
        )
    return table
