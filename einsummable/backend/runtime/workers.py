"""The worker processes' environment: what every spawned rank (the executor's pools, the
bench's measured ranks) starts with, the port it meets on, the threads it uses, and that it
never runs the user's script again."""
from __future__ import annotations

import contextlib
import os
import socket
import sys
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
    """Spawned workers read their environment at start: set WORKER_ENV for the spawn only,
    and start them as the library's own processes (`library_main`)."""
    added = {k: v for k, v in WORKER_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        with library_main():
            yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@contextlib.contextmanager
def library_main() -> Iterator[None]:
    """Processes spawned inside this block do not run the parent's `__main__`.

    A spawned process re-runs the parent's main script (its `__file__`, or its module under
    `python -m`) before it unpickles its target, so that functions defined there resolve. A
    worker's target and arguments are the library's own, so that is never needed, and it is
    harmful: a user's script without an `if __name__ == "__main__":` guard would start its
    own ranks in every rank (Python's bootstrapping error), and a script read from standard
    input cannot be re-run at all. multiprocessing decides what to re-run from the main
    module's `__spec__` and `__file__` when the process starts, so they are hidden for that
    moment and put back."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)
