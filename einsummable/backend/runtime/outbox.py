"""Sends that wait for their data without stopping the rank: the executor's side of the
communication engine the simulator models (`network.Outbox`).

A relay forwards a block it is still receiving. The send cannot go out with the receive (the
buffer would leave before its bytes arrived), and waiting for the receive in program order
would stall the rank and every kernel after the send with it. So the send goes to a line per
peer: a thread that waits for the block and then sends it, while the rank goes on. Later sends
to that peer join its line, so sends to one peer keep their program order (no other peer's
are held up). The rank's own reads of the block wait on the line's signal that the block has
arrived, not on the receive itself: one waiter per receive.

On GPUs (NCCL) no thread is needed, nor allowed (a communicator takes calls from one thread):
a send posted after its receive's group is ordered behind that receive on NCCL's stream, and
the compute stream does not wait for either, so `stream_ordered` sends go out at once.
"""
from __future__ import annotations

import datetime
import queue
import threading
from typing import Any, Callable

import torch

from ...errors import RuntimeFault

Isend = Callable[[torch.Tensor, int, int], Any]  # (tensor, peer, tag) -> work


class Arrival:
    """Stands for a receive that a line waits on: `wait` blocks until the line has seen the
    block arrive (the executor's reads use it in place of the receive's work)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: str | None = None

    def set(self, error: str | None = None) -> None:
        self.error = error
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: datetime.timedelta) -> bool:
        if not self._done.wait(timeout.total_seconds()):
            return False
        if self.error is not None:
            raise RuntimeError(self.error)
        return True


class Once:
    """A receive's work that two names wait on (a part landed in place: the buffer it landed
    in, and the part sent on under its own name): the first `wait` waits on the work, later
    ones return its answer. A transport's work may be waited on only once (gloo's second wait
    on a finished receive waits for another)."""

    def __init__(self, work: Any) -> None:
        self._work, self._lock, self._ok = work, threading.Lock(), None

    def is_completed(self) -> bool:
        return self._ok is not None or self._work.is_completed()

    def wait(self, timeout: datetime.timedelta) -> bool:
        with self._lock:
            if self._ok is None:
                self._ok = self._work.wait(timeout)
            return self._ok


class _Line(threading.Thread):
    """Sends to one peer, in order, each after the receives it waits for."""

    def __init__(self, peer: int, isend: Isend, timeout_s: float) -> None:
        super().__init__(daemon=True, name=f"einsummable-send-line-{peer}")
        self.peer, self.isend, self.timeout_s = peer, isend, timeout_s
        self.todo: queue.Queue = queue.Queue()
        self.sent: list[tuple[list, torch.Tensor]] = []
        self.error: str | None = None

    def run(self) -> None:
        tmo = datetime.timedelta(seconds=self.timeout_s)
        while True:
            item = self.todo.get()
            if item is None:
                self.todo.task_done()
                return
            tensor, tag, works, arrival = item
            try:
                for w in works:
                    if w.wait(tmo) is False:
                        raise RuntimeError(f"waited {self.timeout_s:.0f} s for its data")
                if arrival is not None:
                    arrival.set()
                data = tensor.contiguous()  # copied now, after its receive, if a view
                self.sent.append(([self.isend(data, self.peer, tag)], data))
            except Exception as e:  # noqa: BLE001 - reported by `close` on the rank's thread
                self.error = self.error or f"forwarding to rank {self.peer}: {e}"
                if arrival is not None:
                    arrival.set(self.error)
            finally:
                self.todo.task_done()


class Outbox:
    def __init__(self, isend: Isend, timeout_s: float, stream_ordered: bool = False) -> None:
        self._isend, self._timeout_s = isend, timeout_s
        self._stream_ordered = stream_ordered
        self._lines: dict[int, _Line] = {}
        self._posted: list[tuple[list, torch.Tensor]] = []

    def busy(self, peer: int) -> bool:
        """Whether sends to `peer` are still in its line (a new one must queue behind)."""
        line = self._lines.get(peer)
        return line is not None and line.todo.unfinished_tasks > 0

    def send(self, peer: int, tag: int, tensor: torch.Tensor, works: list) -> Arrival | None:
        """Send `tensor` to `peer` once `works` (its receive) have completed. Returns the
        Arrival the rank's own reads of the buffer wait on instead (None: keep waiting on the
        receive itself)."""
        if self._stream_ordered:
            data = tensor.contiguous()
            self._posted.append(([self._isend(data, peer, tag)], data))
            return None
        line = self._lines.get(peer)
        if line is None:
            line = self._lines[peer] = _Line(peer, self._isend, self._timeout_s)
            line.start()
        arrival = Arrival() if works else None
        line.todo.put((tensor, tag, list(works), arrival))
        return arrival

    def close(self) -> list[tuple[list, torch.Tensor]]:
        """Wait for every line to hand its sends over; their works, to wait on."""
        for line in self._lines.values():
            line.todo.put(None)
        out = list(self._posted)
        for line in self._lines.values():
            line.join(self._timeout_s)
            if line.is_alive():
                raise RuntimeFault(f"a send line to rank {line.peer} did not finish within "
                                   f"{self._timeout_s:.0f} s",
                                   fix="a peer rank died or stalled; see its error")
            if line.error:
                raise RuntimeFault(line.error, fix="a peer rank died or stalled; see its error")
            out.extend(line.sent)
        return out
