"""Launching N worker processes on CPU (gloo), one torch thread each: `tlt train train.devices=N`, tests and
benchmarks.

Each process joins a gloo process group through a TCPStore hosted by rank 0 and gets a `WorkerContext`
with the same store under its own prefix (for flags such as "all ranks finished their rollout"). Under
torchrun (or a Lightning launcher), `context_from_process_group` builds the `WorkerContext` from that job's
own process group and store instead.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


@dataclass(frozen=True)
class WorkerContext:
    rank: int
    world_size: int
    store: dist.Store  # key-value store shared by all ranks (not the process group's own keys)
    device: torch.device


# Without a deadline (long training runs): how long a collective or a blocking store read may wait.
NO_DEADLINE_COLLECTIVE_TIMEOUT_S = 3600.0


def launch_cpu(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float | None = 120.0) -> list[Any]:
    """Run `fn(ctx, *args)` in `world_size` spawned processes; return each rank's result, by rank.

    `fn` must be importable by the children (a module-level function). A child's exception is raised here
    (torch.multiprocessing.ProcessRaisedException, with its traceback) and the other children are ended;
    after `timeout_s` all children are killed and TimeoutError is raised (None: no deadline; a collective
    then waits up to NO_DEADLINE_COLLECTIVE_TIMEOUT_S). Results travel through temporary files (torch.save).
    """
    port = _free_port()
    pg_timeout = NO_DEADLINE_COLLECTIVE_TIMEOUT_S if timeout_s is None else timeout_s
    with tempfile.TemporaryDirectory(prefix="tlt-launch-") as tmp:
        procs = mp.start_processes(
            _entry,
            args=(fn, world_size, port, tmp, pg_timeout, args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not procs.join(timeout=0.2):
            if deadline is not None and time.monotonic() > deadline:
                for p in procs.processes:
                    p.kill()
                raise TimeoutError(f"launch_cpu: {world_size} workers did not finish within {timeout_s} s")
        return [torch.load(Path(tmp) / f"{rank}.pt", weights_only=False) for rank in range(world_size)]


def _entry(rank: int, fn, world_size: int, port: int, tmp: str, timeout_s: float, args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=timeout)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world_size, timeout=timeout
    )
    try:
        ctx = WorkerContext(rank, world_size, dist.PrefixStore("tlt", store), torch.device("cpu"))
        torch.save(fn(ctx, *args), Path(tmp) / f"{rank}.pt")
        dist.barrier()  # rank 0 hosts the store: nobody leaves while another still uses it
    finally:
        dist.destroy_process_group()


def context_from_process_group(device: torch.device) -> WorkerContext:
    """The `WorkerContext` of a process in an initialised default process group (torchrun, SLURM + torchrun):
    its rank and size, and the group's own store under the "tlt" prefix."""
    from torch.distributed.distributed_c10d import _get_default_store

    store = dist.PrefixStore("tlt", _get_default_store())
    return WorkerContext(dist.get_rank(), dist.get_world_size(), store, device)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
