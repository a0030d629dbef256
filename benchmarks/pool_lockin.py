"""The pool's choice of one thread after another runtime's calls: blocks of ONNX Runtime calls and package calls.

    python benchmarks/pool_lockin.py --pkg-dir DIR [--baseline DIR] [--model mobilenet] [--blocks 20] [--calls 30]

cpu_side_by_side.py times its engines in turn in one process, --calls each; ONNX Runtime's threads spin for
~20 ms after its calls, so the first few milliseconds of the package's turn that follows find a core taken.
A package once stayed on one thread for a whole run after such turns (MobileNet at 4.17 ms, its one-thread
time, against 2.4-2.6). This alternates ``--calls`` ORT calls with ``--calls`` calls of the package (and of
the --baseline package, built by an older aotc with ``cpu_contention.py --build-only``), for ``--blocks``
blocks, and prints per package: the median of the blocks' medians, the worst block's median, and the share
of calls the pool ran on one thread (its counters). Wall-clock times: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_contention import ALL, _load, _package
from cpu_side_by_side import _ort


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mobilenet")
    ap.add_argument("--pkg-dir", type=Path, required=True)
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--target", default="cpu:native")
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    _, make, inputs = ALL[args.model]
    torch.manual_seed(1)
    xt = inputs()
    x = xt.numpy()
    models = {"new": _load(_package(args.model, args.pkg_dir, args.target), "auto")}
    if args.baseline is not None:
        models["base"] = _load(args.baseline / f"{args.model}.pkg", "auto")
    torch.manual_seed(0)
    ort_call = _ort(make().eval(), xt, Path(tempfile.mkdtemp(prefix="lockin_")), os.cpu_count() or 1)
    for m in models.values():
        np.asarray(m(x))
    block_ms: dict[str, list[float]] = {k: [] for k in models}
    start = {k: m.executor.pool_stats() for k, m in models.items()}
    for block in range(args.blocks):
        for name, m in list(models.items())[:: 1 if block % 2 else -1]:  # (each goes first in half the blocks)
            for _ in range(args.calls):
                ort_call()
            ts = []
            for _ in range(args.calls):
                t = time.perf_counter()
                m(x)
                ts.append(time.perf_counter() - t)
            block_ms[name].append(statistics.median(ts) * 1e3)
    for name, m in models.items():
        end = m.executor.pool_stats()
        solo = calls = 0
        if start[name] is not None and end is not None:
            solo, calls = end["solo_calls"] - start[name]["solo_calls"], end["calls"] - start[name]["calls"]
        ms = block_ms[name]
        print(
            f"{args.model} {name:5s} median of block medians {statistics.median(ms):.3f} ms, worst block {max(ms):.3f} ms, "
            f"best {min(ms):.3f} ms; solo calls {solo}/{calls}; loadavg {os.getloadavg()[0]:.2f}"
        )


if __name__ == "__main__":
    main()
