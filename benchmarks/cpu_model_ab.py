"""A/B of whole aotc packages against ONNX Runtime on one of cpu_side_by_side.py's models, interleaved in one
process: per engine the wall time and the process's CPU time of single calls, in rounds that alternate the
engines, at a fixed thread count (the pool's adaptation off: kernel speed, not the thread policy).

    python benchmarks/cpu_model_ab.py [--model mobilenet] [--threads 2] [--rounds 20] [--no-ort] [--precision bf16]
                                      [A.pkg B.pkg ...]

Without packages it builds one from the working tree (``--target``, ``--precision``). Each package is fed
the input in its own dtype (``model.cast``); a bf16 run leaves ONNX Runtime out (no bf16 CPU kernels). To compare against another commit,
build its package with that commit's builder first, e.g. (``base`` a directory holding ``git archive`` of
aot/, runtime/ and cpp_templates/ laid out as the installed names: aotc_build/ with cpp_templates/ inside,
and aotc/)::

    PYTHONPATH=base python -c '...build_captured(...)'   # then: python benchmarks/cpu_model_ab.py base.pkg new.pkg

On a machine other processes load, wall medians measure the load as much as the code: read the CPU-time
medians (work per call, spin-waits of idle workers included), the 10th percentile and the minimum of wall.
CPU time is the sum of every thread's own clock (``cpu_ns``), not time.process_time: the process clock
leaves out what a thread still running on another core has used since its last tick, which for calls of a
few milliseconds undercounts the second thread's share.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from cpu_side_by_side import MODELS, prepared  # noqa: E402


def cpu_ns() -> int:
    """The CPU time of every thread of this process, each read from its own clock (Linux: the clock id of
    thread ``tid`` is (~tid << 3) | 6, CPUCLOCK_SCHED of one thread), which counts its running time to now."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # the thread has exited
            total += time.clock_gettime_ns((~int(tid) << 3) | 6)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("packages", nargs="*", type=Path)
    ap.add_argument("--model", default="mobilenet", choices=list(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--calls", type=int, default=10, help="calls per engine per round")
    ap.add_argument("--target", default="cpu:native", help="the package built when none is given")
    ap.add_argument("--no-ort", action="store_true",
                    help="packages only: ONNX Runtime's threads spin ~20 ms after its calls, CPU time the next "
                         "engine's calls count")  # fmt: skip
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="of the package built when none is given")
    args = ap.parse_args()
    args.no_ort = args.no_ort or args.precision == "bf16"
    import aotc
    import onnxruntime as ort

    _, make, inputs = MODELS[args.model]
    model, x = prepared(make, inputs)
    work = Path(tempfile.mkdtemp(prefix="model_ab_"))
    torch.onnx.export(model, (x,), str(work / "m.onnx"), dynamo=False, opset_version=17)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(str(work / "m.onnx"), so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x.numpy()}
    fns: dict[str, Callable[[], object]] = {} if args.no_ort else {"onnxruntime": lambda: sess.run(None, feed)}
    pkgs = list(args.packages)
    if not pkgs:
        from aotc_build.build import build_captured
        from aotc_build.capture import capture_module
        from aotc_build.options import BuildOptions, parse_target

        pkgs = [work / "m.pkg"]
        options = BuildOptions(targets=(parse_target(args.target),), selftest=False, precision=args.precision)
        build_captured(capture_module(model, (x,), name=args.model, precision=args.precision), pkgs[0], options)
    xn = x.numpy()
    with torch.no_grad():
        want = model(x).numpy()
    for p in pkgs:
        m = aotc.load(p, device="cpu", num_threads=args.threads)
        m.executor.set_threads(args.threads, fixed_threads=True)
        xp = m.cast({m.inputs[0].name: xn})[m.inputs[0].name]
        got = np.asarray(m(xp)).astype(np.float32)
        print(f"{p}: {m.executor.target}, max abs diff to fp32 eager {float(np.abs(got - want).max()):.2e}")
        fns[p.name] = lambda m=m, xp=xp: m(xp)
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            fn()
            for _ in range(args.calls):
                t, c = time.perf_counter(), cpu_ns()
                fn()
                wall[name].append(time.perf_counter() - t)
                cpu[name].append((cpu_ns() - c) * 1e-9)
    print(f"{args.model}, {args.threads} threads (fixed), {args.rounds} rounds x {args.calls} calls, load {os.getloadavg()[0]:.1f}")
    for name in fns:
        w = sorted(wall[name])
        print(f"  {name:24s} cpu median {statistics.median(cpu[name]) * 1e3:7.2f} ms   wall median {statistics.median(w) * 1e3:7.2f}"
              f"  p10 {w[len(w) // 10] * 1e3:7.2f}  min {w[0] * 1e3:7.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
