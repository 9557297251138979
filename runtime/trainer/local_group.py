"""Run a function on N local processes joined in one process group (tests and benchmarks).

The Ray runtime forms its group across actors; this is the same group without
Ray, for checks of the sharded trainer alone. Each process gets one intra-op
thread, as the Ray trainer actors do on a CPU machine.
"""

from __future__ import annotations

import os
import pickle
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def init_process_group(rank: int, world_size: int, address: str, port: int, backend: str) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(minutes=10),
    )


def _entry(rank: int, world_size: int, port: int, function: Callable[..., Any], args: tuple, results: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        init_process_group(rank, world_size, "127.0.0.1", port, "gloo")
        # Plain pickling copies tensors; the default would share their storage, which dies with this process.
        results.put((rank, "ok", pickle.dumps(function(rank, world_size, *args))))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_local_group(function: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
    """function(rank, world_size, *args) on every rank over gloo; the per-rank return values, by rank.

    `function` must be importable (a module-level function) and return picklable values.
    """
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    port = free_port()
    processes = [
        context.Process(target=_entry, args=(rank, world_size, port, function, args, results), daemon=False)
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    collected: dict[int, Any] = {}
    errors: list[str] = []
    for _ in processes:
        rank, status, value = results.get()
        if status == "ok":
            collected[rank] = pickle.loads(value)
        else:
            errors.append(f"rank {rank}:\n{value}")
            break
    for process in processes:
        process.join(timeout=5 if errors else None)
        if process.is_alive():
            process.kill()
    if errors:
        raise RuntimeError("a rank of the local process group failed\n" + "\n".join(errors))
    return [collected[rank] for rank in range(world_size)]
