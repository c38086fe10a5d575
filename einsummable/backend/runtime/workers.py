"""The worker processes' environment: what every spawned rank (the executor's pools, the
bench's measured ranks) starts with, the port it meets on, the threads it uses."""
from __future__ import annotations

import contextlib
import os
import socket
from typing import Iterator

# Environment of every worker, unless the caller set the variable. With OpenMP's default wait
# policy a worker's idle threads spin at each barrier against its gloo and queue threads; on a
# shared 2-core machine a 1-rank program took ~35x the local executor's time, passive ~1x.
# glibc's malloc maps blocks above a moving threshold afresh and hands freed memory back to
# the kernel, so every run of a program faulted its activations' pages in again. Blocks up to
# glibc's largest mmap threshold (32 MiB on 64-bit) come from the heap and freed memory stays
# in the process: the llama-tiny block at 2048 tokens on one rank, 1 thread, its SiLU-gate
# kernel 1.8-2.2 -> 0.51-0.53 ms, the program 15.0-16.6 -> 11.9-13.0 ms, the nn.Module's
# forward 56 -> 22-26 ms (interleaved runs, 2026-12-05).
MALLOC_MMAP_MAX_THRESHOLD: str = str(32 << 20)
MALLOC_KEEP_FREED: str = str(4 << 30)
WORKER_ENV: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE",
                              "MALLOC_MMAP_THRESHOLD_": MALLOC_MMAP_MAX_THRESHOLD,
                              "MALLOC_TRIM_THRESHOLD_": MALLOC_KEEP_FREED}


def threads_per_rank(world: int) -> int:
    """Torch threads a worker uses: the cores split evenly, at least one (calibrate matches)."""
    return max(1, (os.cpu_count() or 1) // world)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def worker_env() -> Iterator[None]:
    """Spawned workers read their environment at start: set WORKER_ENV for the spawn only."""
    added = {k: v for k, v in WORKER_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)
