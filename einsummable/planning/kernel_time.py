"""The time of one kernel call on one device: the compute model that the optimizer's cost model
and the simulator share, so that both price every kernel alike.

A call doing F FLOP and moving B bytes through memory (its inputs read, its output written) on
device d takes

    flop_s   = F / (peak_d(dtype) · a_class(F) · flop_efficiency)
    memory_s = B / (mem_bw_d · a_memory · mem_efficiency)
    kernel_s = launch_d + max(flop_s, memory_s)                        (roofline + launch)

a_class is the fraction of peak the device achieves for the op's class (`topology/achieved.py`):
"matmul" for contractions (a join multiplying two operands, summed over a mode longer than
one, and the fused convolution, an implicit matrix product), "attention" for the fused
attention kernels (forward and backward), and peak for the rest, whose elementwise
work is bound by memory and pays a_memory there. A copy (stitching blocks, packing messages,
folding partial sums) only moves bytes: copy_s = launch + bytes / (mem_bw · a_memory ·
mem_efficiency). `flop_efficiency` and `mem_efficiency` are `cost.CostModel`'s global derating
knobs (1: none).

Contention. While transfers touching device d move R bytes/s (sent or received), its kernels
lose s = `transfer_slowdown` of their FLOP rate (NCCL's kernels hold SMs) and h = min(h_max,
m · R / achieved memory rate) of their memory rate (m = `transfer_memory`: the bytes are read
at the sender and written at the receiver). A kernel of d = max(flop_s, memory_s) seconds
unloaded runs at the fraction 1 - f of its rate under load, where

    d_loaded = max(flop_s / (1 - s), memory_s / (1 - h)),      f = 1 - d / d_loaded

and if the transfers go on for τ more seconds from its start, its work is d: it does
(1 - f) τ of it under load, the rest at full rate, so

    kernel_s = launch + min(d_loaded, d + f τ)                 (`loaded_s`)

The objective and the FSDP baseline state the same rule in aggregate (`contention_share`):
weights that stream for W seconds behind C seconds of compute (W ≤ C) cost C + κ W, where
per second of stream the compute-bound kernels lose s and the memory-bound ones h:

    κ = (1 - μ) s + μ h,     h = min(h_max, m · R / achieved memory rate)

μ the share of the compute's seconds in memory-bound kernels (memory_s ≥ flop_s; the graph
on one device, `cost.memory_bound_share`) and R the stream's byte rate through the device,
in and out: its ports' rates (a stream fills them) where no rate is given.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..frontend.ir import Op

# Peak rates are given per float dtype; work on other dtypes (int64 indices, float64) is
# priced at the float32 rate.
FALLBACK_DTYPE = "float32"
# Transfers can take at most this share of a device's memory rate from its kernels (a rate
# above the memory's would otherwise stall the kernel outright).
MAX_MEMORY_TAKEN = 0.95
MATMUL, ATTENTION, OTHER = "matmul", "attention", "other"
# The share of a device's memory rate a copy on its copy stream takes while kernels run beside
# it: two streams that both want all of it get half each (its bytes are read and written, so
# it copies at half that rate).
COPY_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class KernelTime:
    flop_s: float
    memory_s: float
    launch_s: float

    @property
    def total_s(self) -> float:
        return self.launch_s + max(self.flop_s, self.memory_s)


@lru_cache(maxsize=65536)
def op_class(op: Op) -> str:
    """"matmul", "attention" or "other" (module docstring)."""
    if op.fused is not None:
        return {"attention": ATTENTION, "attention_grad": ATTENTION,
                "conv": MATMUL}.get(op.fused, OTHER)
    join = op.join
    contracts = any(op.size[m] > 1 for m in op.agg_modes)
    if op.agg == "sum" and contracts and join is not None and join.fn == "mul":
        args = {a.value for a in join.args if a.fn == "arg"}
        if len(args) == 2:
            return MATMUL
    return OTHER


def peak_of(device, dtype: str) -> float:
    return device.peak(dtype if dtype in device.peak_flops else FALLBACK_DTYPE)


def kernel_time(op: Op, flops: float, nbytes: float, dtype: str, device,
                flop_efficiency: float = 1.0, mem_efficiency: float = 1.0) -> KernelTime:
    """One call of `op` on `device` doing `flops` and moving `nbytes` (module docstring)."""
    achieved = device.achieved
    kind = op_class(op)
    fraction = (achieved.matmul.at(flops) if kind == MATMUL else
                achieved.attention.at(flops) if kind == ATTENTION else 1.0)
    flop_s = flops / (peak_of(device, dtype) * fraction * flop_efficiency)
    memory_s = nbytes / (device.mem_bw * achieved.memory * mem_efficiency)
    return KernelTime(flop_s, memory_s, device.launch_s)


def memory_rate(device, mem_efficiency: float = 1.0) -> float:
    """Bytes/s the device's memory passes at its achieved rate."""
    return device.mem_bw * device.achieved.memory * mem_efficiency


def memory_s(device, nbytes: float, mem_efficiency: float = 1.0) -> float:
    """Seconds for `nbytes` to pass through the device's memory at its achieved rate."""
    return nbytes / memory_rate(device, mem_efficiency)


def copy_s(device, nbytes_moved: float, kernels: int = 1, mem_efficiency: float = 1.0) -> float:
    """`kernels` copy kernels moving `nbytes_moved` bytes in all (read plus write counted)."""
    return kernels * device.launch_s + memory_s(device, nbytes_moved, mem_efficiency)


def loaded_s(kt: KernelTime, device, rate: float, drain_s: float,
             mem_efficiency: float = 1.0) -> float:
    """Seconds of a kernel priced `kt` that starts while transfers touching `device` move
    `rate` bytes/s for `drain_s` more seconds (module docstring, contention)."""
    return loaded_spans_s(kt, device, (Span(rate, 0.0, drain_s, True),), mem_efficiency)


@dataclass(frozen=True)
class Span:
    """What loads a device for `seconds` (`network.Network.load`): transfers moving
    `transfer_rate` bytes/s to or from it, copies on its copy stream moving `copy_rate`
    bytes/s through its memory (read plus write), and whether one of them holds its
    compute units (NCCL's kernels do; a copy engine does not)."""
    transfer_rate: float
    copy_rate: float
    seconds: float
    sms: bool


def loaded_spans_s(kt: KernelTime, device, spans, mem_efficiency: float = 1.0) -> float:
    """The contention rule piecewise: the loads of `spans` one after another from the
    kernel's start (flows that end one by one). In a span the kernel does its work at
    d / d_loaded of its rate, after the last at its full rate; with one span of transfers
    this is launch + min(d_loaded, d + f τ). s is lost only where a flow holds compute units.
    A copy stream's copies take memory beside the transfers' h, but two streams that both
    want the memory share it: the kernel keeps at least half of what the transfers leave."""
    a = device.achieved
    d = max(kt.flop_s, kt.memory_s)
    if d <= 0 or not (a.transfer_slowdown or a.transfer_memory):
        return kt.total_s
    left, spent = d, 0.0  # unloaded seconds of work left; seconds gone
    for sp in spans:
        if sp.seconds <= 0:
            continue
        slow = 1.0
        if sp.transfer_rate > 0 or sp.copy_rate > 0:
            h = _memory_taken(device, sp.transfer_rate, mem_efficiency)
            if sp.copy_rate > 0:
                copies = sp.copy_rate / memory_rate(device, mem_efficiency)
                h = min(h + copies, MAX_MEMORY_TAKEN, 1.0 - (1.0 - h) / 2)
            s = a.transfer_slowdown if sp.sms else 0.0
            slow = max(kt.flop_s / (1.0 - s), kt.memory_s / (1.0 - h)) / d
        if left * slow <= sp.seconds:
            return kt.launch_s + spent + left * slow
        spent += sp.seconds
        left -= sp.seconds / slow
    return kt.launch_s + spent + left


def _memory_taken(device, rate: float, mem_efficiency: float = 1.0) -> float:
    """h of the module docstring: the share of the device's memory rate a transfer rate takes."""
    a = device.achieved
    return min(MAX_MEMORY_TAKEN,
               a.transfer_memory * rate / (device.mem_bw * a.memory * mem_efficiency))


def contention_share(topology, memory_bound: float = 0.0, rate: float | None = None,
                     level: int | None = None) -> float:
    """κ of the module docstring: the compute seconds a weight stream costs per second it
    runs behind compute, on the topology's most affected device; `memory_bound` is μ, `rate`
    the stream's bytes/s through a device (None: its ports' rates, in and out, those to its
    peers at `level` of the hierarchy where one is given)."""
    best = 0.0
    for dev in topology.devices:
        a = dev.achieved
        r = port_rate(topology, dev.id, level) if rate is None else rate
        taken = _memory_taken(dev, r)
        best = max(best, (1.0 - memory_bound) * a.transfer_slowdown + memory_bound * taken)
    return best


def copy_charge(topology, memory_bound: float = 0.0) -> float:
    """The compute seconds a gathered weight's stitching copy costs per second it would take
    on the compute stream: all of it there; on a side stream (`Device.prefetch_stream`, every
    device) only what the memory-bound kernels beside it lose, μ of it, since the two
    streams share the memory and the copy's bytes still pass through it (compute-bound
    kernels leave it the memory they do not use, and a copy engine holds no compute units)."""
    if all(d.prefetch_stream for d in topology.devices):
        return memory_bound
    return 1.0


def port_rate(topology, device: int, level: int | None = None) -> float:
    """Bytes/s `device` can move out and in at once: over its links (to its peers at `level`
    of the hierarchy, where one is given), each distinct medium or device port once (a port
    caps every link through it)."""
    total = 0.0
    for ends in ((device, None), (None, device)):
        media: dict[str, float] = {}
        for other in range(topology.world_size):
            if other == device or level is not None and topology.pair_level(device, other) != level:
                continue
            src, dst = (device, other) if ends[0] is not None else (other, device)
            link = topology.link(src, dst)
            if link is None:
                continue
            port = link.egress if ends[0] is not None else link.ingress
            if port is not None and link.port_bw is not None:
                media[port] = link.port_bw
            else:
                media[link.resource] = link.bw
        total += sum(media.values())
    return total
