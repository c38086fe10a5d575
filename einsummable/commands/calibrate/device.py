"""What one device achieves, measured with torch on a `torch.device` (cuda, or cpu).

Every figure is timed by `clock.py` (CUDA events or perf_counter, warm-up calls, median of
trials). The shapes are the ones plans produce: the matmuls of the LLaMA-7B-width block
(dim 4096, FFN 11008, 32 heads of 128) split k = 1, 2, 4, 8 ways, at a few token counts T.

    GEMM        (T x K) @ (K x N) for (N, K) in {(dim/k, dim), (dim, dim/k), (ffn/k, dim),
                (dim, ffn/k)}: q/k/v and gate/up split by output columns, o and down by the
                contraction; rate = 2 T N K / t, per dtype
    square      an n x n x n GEMM per dtype: the best rate of dtypes whose curve is not fitted
    SDPA        torch's scaled_dot_product_attention on (1, heads/k, T, 128), causal and not;
                FLOPs as the project counts one fused attention call (`frontend/kernels.py`:
                every score, causal or not), so fractions line up with what `kernel_time` asks
    elementwise out = a + b (a new tensor) on T x dim and T x ffn/k blocks: 3 · bytes / t
    norm        the runtime's RMSNorm kernel on T x dim: (x + w read, y written) / t
    copy        dst.copy_(src) of a large block on the device (device to device): 2 · bytes / t,
                bytes read plus bytes written
    launch      kernel: a one-element in-place add, many back to back, seconds per call;
                runtime: seconds per kernel of the local executor on this device (a chain of
                tiny elementwise ops lowered for one rank: its time over its Compute count,
                so the Free of each kernel's output, which every block made is given once,
                is in the figure), what a program pays per kernel
    slowdown    the square GEMM alone (t0), and while copies of the large block run on another
                CUDA stream (t1, the copies outlast the GEMMs); on the CPU the copies run in a
                second thread; `transfer_slowdown` = 1 - t0 / t1
"""
from __future__ import annotations

import math
import os
import platform
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...backend.lowering import lower
from ...backend.runtime.local import run_local
from ...core.program import Compute
from ...frontend.builder import Builder
from ...frontend.fuse import fuse
from ...frontend.reference import TORCH_DTYPES, evaluate_op
from ...planning.placement import INPUT_PREFIX, input_op, place
from ...topology import synthetic
from . import clock

ALL_DTYPES = ("float16", "bfloat16", "float32")
# The copies that load the device while the loaded GEMMs run last this much longer than them.
COPY_OVERHANG = 1.5
# A norm's epsilon (any: it does not change the time).
NORM_EPS = 1e-6


@dataclass(frozen=True)
class Shapes:
    """The sizes one calibration measures (module docstring)."""
    dim: int
    ffn: int
    heads: int
    head_dim: int
    tokens: tuple[int, ...]
    splits: tuple[int, ...]
    square_n: int
    copy_bytes: int
    launch_ops: int
    budget: clock.Budget


LLAMA_7B = Shapes(dim=4096, ffn=11008, heads=32, head_dim=128, tokens=(256, 1024, 4096),
                  splits=(1, 2, 4, 8), square_n=8192, copy_bytes=1 << 30, launch_ops=200,
                  budget=clock.Budget(warmup=3, trials=5, min_trial_s=0.02))
# The same structure at CPU sizes (a quarter of the width, fewer tokens).
CPU = Shapes(dim=1024, ffn=2752, heads=8, head_dim=128, tokens=(32, 128, 512),
             splits=(1, 2, 4, 8), square_n=512, copy_bytes=1 << 26, launch_ops=200,
             budget=clock.Budget(warmup=2, trials=5, min_trial_s=0.05))
QUICK = Shapes(dim=256, ffn=688, heads=2, head_dim=128, tokens=(8, 32), splits=(1, 2),
               square_n=128, copy_bytes=1 << 22, launch_ops=20,
               budget=clock.Budget(warmup=1, trials=3, min_trial_s=0.002))
# The kernels of the llama-tiny block the CPU ranks run (`einsummable calibrate --world-size`):
# measured on every rank at once, so the curves carry what ranks sharing cores and memory get.
CPU_RANKS = Shapes(dim=64, ffn=172, heads=4, head_dim=16, tokens=(64, 256, 1024, 4096),
                   splits=(1, 2, 4), square_n=256, copy_bytes=1 << 24, launch_ops=100,
                   budget=clock.Budget(warmup=2, trials=3, min_trial_s=0.02))


@dataclass(frozen=True)
class Point:
    """One timed call: what it was, its work (FLOPs or bytes) and its median seconds."""
    kind: str       # "gemm", "sdpa", "sdpa-causal", "square", "elementwise", "norm", "copy"
    dtype: str
    shape: tuple[int, ...]
    work: float
    seconds: float

    @property
    def rate(self) -> float:
        return self.work / self.seconds


@dataclass(frozen=True)
class DeviceFigures:
    """Everything `measure_device` measured (module docstring)."""
    device: str
    name: str
    torch_version: str
    mem_bytes: float
    shapes: Shapes
    points: tuple[Point, ...]
    launch_kernel_s: float
    launch_runtime_s: float
    gemm_alone_s: float
    gemm_loaded_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    def of(self, *kinds: str) -> list[Point]:
        return [p for p in self.points if p.kind in kinds]


def _randn(shape: tuple[int, ...], dtype: str, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=TORCH_DTYPES[dtype])


def gemm_shapes(s: Shapes) -> list[tuple[int, int, int]]:
    """(T, N, K) of every distinct matmul the split block runs (module docstring)."""
    out: dict[tuple[int, int, int], None] = {}
    for t in s.tokens:
        for k in s.splits:
            if s.dim % k or s.ffn % k:
                continue
            for n, kk in ((s.dim // k, s.dim), (s.dim, s.dim // k), (s.ffn // k, s.dim),
                          (s.dim, s.ffn // k)):
                out[(t, n, kk)] = None
    return list(out)


def gemm_point(t: int, n: int, k: int, dtype: str, device: torch.device,
               budget: clock.Budget, kind: str = "gemm") -> Point:
    a, b = _randn((t, k), dtype, device), _randn((k, n), dtype, device)
    c = torch.empty((t, n), device=device, dtype=a.dtype)
    sec = clock.seconds(lambda: torch.matmul(a, b, out=c), device, budget)
    return Point(kind, dtype, (t, n, k), 2.0 * t * n * k, sec)


def attention_flops(heads: int, tokens: int, head_dim: int, causal: bool) -> float:
    """FLOPs the project counts for one fused attention call of these sizes."""
    b = Builder()
    q = b.input("q", (1, heads, tokens, head_dim))
    k = b.input("k", (1, heads, tokens, head_dim))
    v = b.input("v", (1, heads, tokens, head_dim))
    g = b.build([b.attention(q, k, v, causal=causal, fused=True)])
    return float(g.ops[-1].flops)


def sdpa_point(heads: int, t: int, e: int, causal: bool, dtype: str, device: torch.device,
               budget: clock.Budget) -> Point:
    q, k, v = (_randn((1, heads, t, e), dtype, device) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    sec = clock.seconds(lambda: sdpa(q, k, v, is_causal=causal), device, budget)
    return Point("sdpa-causal" if causal else "sdpa", dtype, (heads, t, e),
                 attention_flops(heads, t, e, causal), sec)


def elementwise_point(rows: int, cols: int, dtype: str, device: torch.device,
                      budget: clock.Budget) -> Point:
    """a + b into a new tensor, as the runtime's kernels write theirs."""
    a, b = _randn((rows, cols), dtype, device), _randn((rows, cols), dtype, device)
    sec = clock.seconds(lambda: torch.add(a, b), device, budget)
    return Point("elementwise", dtype, (rows, cols), 3.0 * a.numel() * a.element_size(), sec)


def norm_point(rows: int, cols: int, dtype: str, device: torch.device,
               budget: clock.Budget) -> Point:
    """The runtime's own RMSNorm kernel (the fused op `fuse` makes of Builder.rms_norm)."""
    b = Builder(dtype)
    x, w = b.input("x", (rows, cols)), b.weight("w", (cols,))
    op = fuse(b.build([b.rms_norm(x, w, NORM_EPS)])).ops[-1]
    xs = [_randn((rows, cols), dtype, device), _randn((cols,), dtype, device)]
    sec = clock.seconds(lambda: evaluate_op(op, xs), device, budget)
    size = xs[0].element_size()
    return Point("norm", dtype, (rows, cols), float(size * (2 * rows * cols + cols)), sec)


def copy_point(nbytes: int, device: torch.device, budget: clock.Budget) -> Point:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    sec = clock.seconds(lambda: dst.copy_(src), device, budget)
    return Point("copy", "uint8", (nbytes,), 2.0 * nbytes, sec)


def launch_kernel_s(device: torch.device, budget: clock.Budget) -> float:
    x = torch.zeros(1, device=device)
    return clock.seconds(lambda: x.add_(1.0), device, budget)


def launch_runtime_s(device: torch.device, ops: int, budget: clock.Budget) -> float:
    """Seconds per kernel of the local executor running a chain of tiny ops on device, the
    host bookkeeping around each kernel (its output's Free) included (module docstring)."""
    b = Builder()
    x = b.input("x", (4,))
    y = x
    for _ in range(ops):
        y = y * 0.5 + x
    g = b.build([y])
    ch = {op.name: place(op, {}, [0]) for op in g.ops}
    ch.update({INPUT_PREFIX + t.name: place(input_op(t), {}, [0]) for t in g.inputs})
    low = lower(g, ch, synthetic(1))
    ins = {"x": torch.randn(4)}
    per_run = clock.seconds(lambda: run_local(low, ins, device=device), device, budget)
    return per_run / sum(isinstance(i, Compute) for i in low.programs[0].instrs)


def _loaded_seconds(gemm: Callable[[], object], device: torch.device, alone_s: float,
                    src: torch.Tensor, dst: torch.Tensor, copy_s: float,
                    budget: clock.Budget) -> float:
    """Median seconds of one GEMM while copies of src into dst run beside it (docstring)."""
    reps = max(1, math.ceil(budget.min_trial_s / max(alone_s, 1e-9)))
    copies = max(1, math.ceil(COPY_OVERHANG * reps * alone_s / max(copy_s, 1e-9)))
    times = []
    if device.type == "cuda":
        side = torch.cuda.Stream(device)
        main = torch.cuda.current_stream(device)
        for _ in range(budget.warmup + budget.trials):
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(copies):
                    dst.copy_(src)
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record(main)
            for _ in range(reps):
                gemm()
            end.record(main)
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3 / reps)
        return sorted(times[budget.warmup:])[budget.trials // 2]
    stop = threading.Event()

    def copy_loop() -> None:
        while not stop.is_set():
            dst.copy_(src)
    worker = threading.Thread(target=copy_loop, daemon=True)
    worker.start()
    try:
        return clock.seconds(gemm, device, budget)
    finally:
        stop.set()
        worker.join(timeout=max(10.0, 100 * copy_s))


def slowdown_pair(device: torch.device, s: Shapes, dtype: str, copy: Point
                  ) -> tuple[float, float]:
    """(seconds of the square GEMM alone, with copies running beside it)."""
    n = s.square_n
    a, b = _randn((n, n), dtype, device), _randn((n, n), dtype, device)
    c = torch.empty_like(a)

    def gemm() -> None:
        torch.matmul(a, b, out=c)
    alone = clock.seconds(gemm, device, s.budget)
    src = torch.empty(s.copy_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    loaded = _loaded_seconds(gemm, device, alone, src, dst, copy.seconds, s.budget)
    return alone, loaded


def _mem_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores, " \
           f"{torch.get_num_threads()} torch threads)"


def kernel_points(device: torch.device, s: Shapes, curve_dtypes: tuple[str, ...],
                  progress: Callable[[str], None] = lambda _: None,
                  causal_only: bool = False) -> list[Point]:
    """The GEMM, SDPA, elementwise and norm points of the module docstring (what the achieved
    curves and the memory fraction are fitted to)."""
    bud = s.budget
    pts: list[Point] = []
    progress(f"GEMMs over {len(gemm_shapes(s))} shapes x {len(curve_dtypes)} dtypes")
    for dtype in curve_dtypes:
        for t, n, k in gemm_shapes(s):
            pts.append(gemm_point(t, n, k, dtype, device, bud))
    progress("SDPA")
    for dtype in curve_dtypes:
        for t in s.tokens:
            for k in s.splits:
                if s.heads % k == 0:
                    for causal in (True,) if causal_only else (True, False):
                        pts.append(sdpa_point(s.heads // k, t, s.head_dim, causal, dtype,
                                              device, bud))
    progress("memory")
    mem_dtype = curve_dtypes[0]
    for t in s.tokens:
        widths = {s.dim} | {s.ffn // k for k in s.splits if s.ffn % k == 0}
        for w in sorted(widths):
            pts.append(elementwise_point(t, w, mem_dtype, device, bud))
        pts.append(norm_point(t, s.dim, mem_dtype, device, bud))
    return pts


def measure_device(device: torch.device | str, shapes: Shapes, curve_dtypes: tuple[str, ...],
                   progress: Callable[[str], None] = lambda _: None) -> DeviceFigures:
    """Every figure of the module docstring on `device`; curves in `curve_dtypes`."""
    dev = clock.check_device(device)
    s, bud = shapes, shapes.budget
    pts = kernel_points(dev, s, curve_dtypes, progress)
    for dtype in ALL_DTYPES:
        pts.append(gemm_point(s.square_n, s.square_n, s.square_n, dtype, dev, bud, "square"))
    copy = copy_point(s.copy_bytes, dev, bud)
    pts.append(copy)
    progress("launch and slowdown")
    kernel = launch_kernel_s(dev, bud)
    runtime = launch_runtime_s(dev, s.launch_ops, bud)
    alone, loaded = slowdown_pair(dev, s, curve_dtypes[0], copy)
    return DeviceFigures(str(dev), _name(dev), torch.__version__, _mem_bytes(dev), s,
                         tuple(pts), kernel, runtime, alone, loaded)
