"""Wall-clock figures that used to be test thresholds, printed instead of asserted.

    python -m experiments.speed_checks [--repeats 5] [--skip-calibrate]

The tests check behaviour only (the exchange is delivered exactly, `calibrate --quick` uses the
short effort); how fast that runs depends on the machine, so it is measured here:

- synthesis-64x64: seconds of one `synthesize` of a 512x512 tensor stored as 8x8 blocks on the
  8 devices of dgx1-v100 and read as 64 row stripes (the tests once required < 0.25 s);
- calibrate-quick: seconds of `einsummable calibrate --world-size 2 --quick` (once < 20 s).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def synthesis_64x64_s(repeats: int) -> list[float]:
    from einsummable.frontend.ir import TensorInfo, make_op
    from einsummable.frontend.scalar import arg, call
    from einsummable.planning.exchange import synthesize
    from einsummable.planning.placement import input_needs, output_layout, place
    from einsummable.topology import load_topology
    topo = load_topology("dgx1-v100")
    x = make_op("p", "ij,jk->ik", ["a", "b"], "t", {"a": (512, 512), "b": (512, 512)},
                join=call("mul", arg(0), arg(1)), agg="sum")
    y = make_op("c", "ik->ik", ["t"], "u", {"t": (512, 512)}, join=arg(0))
    pieces = output_layout(x, place(x, {"i": 8, "k": 8}, [d % 8 for d in range(64)]))
    needs = input_needs(y, place(y, {"i": 64}, [d % 8 for d in range(64)]), 0)
    info = TensorInfo("t", (512, 512))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        synthesize(info, pieces, needs, "sum", topo)
        out.append(time.perf_counter() - t0)
    return out


def calibrate_quick_s() -> float:
    from einsummable.cli import main as cli
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        code = cli(["calibrate", "--world-size", "2", "--quick", "--out",
                    str(Path(d) / "cpu2.yaml")])
        dt = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"calibrate exited with {code}")
    return dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-calibrate", action="store_true")
    args = ap.parse_args(argv)
    times = synthesis_64x64_s(args.repeats)
    print(f"synthesis-64x64: median {statistics.median(times) * 1e3:.1f} ms, "
          f"min {min(times) * 1e3:.1f} ms over {len(times)} runs")
    if not args.skip_calibrate:
        print(f"calibrate-quick: {calibrate_quick_s():.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
