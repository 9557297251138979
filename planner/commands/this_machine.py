"""This machine as the planner prices it for rlplan's CPU runtime: its CPU rates (measured by
`rlplan calibrate --cpu`, else estimated from /proc/cpuinfo), its RAM (/proc/meminfo), and the cluster of
one-process trainer ranks it makes. Part of the commands layer: it reads files, the planner's pure
modules take the values it returns (`hardware.py`'s `CpuRates`, a `Cluster`).
"""

from __future__ import annotations

import os

from rlplan.planner.commands.commands_io import MAX_INPUT_BYTES


def _read_proc(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(MAX_INPUT_BYTES)
    except OSError:
        return ""


def this_machine_cpu(profile=None):
    """This machine's CPU rates: measured (a profile from `rlplan calibrate --cpu`), else estimated from cpuinfo."""
    from rlplan.planner.hardware import estimate_cpu_rates, measured_cpu_rates

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    estimate = estimate_cpu_rates(_read_proc("/proc/cpuinfo"), cores)
    if profile is not None and profile.cpu_measured_tflops > 0 and profile.cpu_measured_gbps > 0:
        # A profile from before bf16 was measured keeps the estimate's bf16/fp32 ratio.
        bf16 = profile.cpu_measured_bf16_tflops or profile.cpu_measured_tflops * estimate.bf16_tflops / estimate.tflops
        return measured_cpu_rates(profile.cpu_measured_tflops, bf16, profile.cpu_measured_gbps, cores)
    return estimate


def this_machine_compute_dtype(profile=None) -> str:
    """The dtype `solve --device cpu` has this machine's trainer and engine compute in (solver.with_cpu_compute)."""
    return this_machine_cpu(profile).per_rank(1, 1.0).fastest_compute_dtype


def this_machine_memory_gib() -> float | None:
    """MemTotal of /proc/meminfo in GiB, or None where it cannot be read."""
    for line in _read_proc("/proc/meminfo").splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal" and value.split() and value.split()[0].isdigit():
            return int(value.split()[0]) * 1024 / 2**30
    return None


def cpu_cluster(ranks: int, host_memory_gib: float, profile=None):
    """A CPU machine as the planner prices it: `ranks` one-process trainer ranks sharing its cores and RAM.

    Returns the cluster and the machine's rates (their `source` says whether measured or estimated).
    """
    rates = this_machine_cpu(profile)
    return rates.cluster(ranks, host_memory_gib), rates
