"""A/B of CPU matmul variants (cpp_templates/matmul.h), interleaved in one process, against torch.mm.

    python benchmarks/cpu_matmul_ab.py [--level x86-64-v4|x86-64-v3] [--threads 1,2]
        [--shapes 2048x2048x2048,64x4096x1024,...] [--base REV] [--variant NAME=-DFLAG=V,-DFLAG2=V ...]
        [--rounds 7] [--reps 5] [--micro] [--no-torch] [--cold [MB]] [--cpu-time]

Each variant is benchmarks/matmul_ab.cpp built into its own library: the working tree's templates with the
variant's -D flags, or with --base REV the templates of git revision REV as variant "base" (so a change can
be measured against the commit before it). Shapes are MxNxK (C[M, N] = A[M, K] @ W[K, N] + bias, W packed
as at build time; a trailing "g" adds the GELU epilogue, erf form, "t" the tanh form of GPT-2).
Per shape and thread count, every round calls each
engine in turn (best of --reps calls; on one thread the call's CPU time, which leaves out the time slices
other processes take on a loaded machine) and the median over rounds is reported, in GFLOP/s and relative to
the first variant (and, in brackets, the ratio of the best calls): rounds interleave, so a load that comes and goes hits every engine alike.
--micro also prints the micro-kernel's own rate (one thread, operands in L1) per variant.
--cold MB reads a buffer of MB MiB (64 when MB is left out) before every call, on the call's threads, so the
weights and activations come from memory as in a model, where other layers run between two calls of one;
a hot loop keeps them in L2 and flatters the rates. --cpu-time times every call by the CPU time of all the
process's threads (spinning workers included) also on several threads, where the default is
wall time: on a shared machine the CPU time leaves out the slices other processes take; GFLOP/s are then
per core-second (torch's figure includes its OpenMP threads' spinning).
Name a variant twice (``--variant a= --variant b=-D... --variant a2=``) to see the noise: on the shared
2-core machine two identical builds' medians differed by up to 5-7% (the first in a round ran slowest).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from aotc.package import aligned_empty

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "benchmarks" / "matmul_ab.cpp"
DEFAULT_SHAPES = "2048x2048x2048,64x4096x1024g,64x4096x4096g,64x1024x4096,128x2304x768,512x3072x768g,512x768x3072,512x256x256,512x1024x256g"
# as aot/compile.py
FLAGS = ["-O3", "-std=c++17", "-fopenmp", "-shared", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off"]
FLAGS += ["-fno-math-errno", "-fno-trapping-math"]
# Quiet before each engine's call: the last engine's pool workers are asleep by then, as between a model's
# calls (a library called right after another once ran every round at 0.50x).
SETTLE_S = 0.002


def build(name: str, templates: Path, level: str, defines: list[str], work: Path) -> ctypes.CDLL:
    out = work / f"ab_{name}.so"
    arch = [f"-march={level}"] + (["-mprefer-vector-width=512"] if level == "x86-64-v4" else [])
    cmd = ["g++", *FLAGS, *arch, *defines, f"-I{templates}", str(HARNESS), "-o", str(out)]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(out))
    f, i64, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ab_mm.argtypes = [i64, i64, i64, f, f, f, f, i, i, i, i, f, i64]
    lib.ab_mm.restype = ctypes.c_double
    lib.ab_pack.argtypes = [i64, i64, f, f]
    lib.ab_micro.argtypes = [i64, i64, i64]
    lib.ab_micro.restype = ctypes.c_double
    lib.ab_peak.argtypes = [i64]
    lib.ab_peak.restype = ctypes.c_double
    lib.ab_tids_ns.argtypes = [f, i]
    lib.ab_tids_ns.restype = ctypes.c_int64
    return lib


def base_templates(rev: str, work: Path) -> Path:
    """The cpp_templates/*.h of git revision ``rev``, written into a new folder under ``work``."""
    d = work / f"templates_{rev.replace('/', '_')}"
    d.mkdir()
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:cpp_templates"],
                           check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    for n in names:
        if n.endswith(".h"):
            blob = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:cpp_templates/{n}"], check=True,
                                  capture_output=True).stdout  # fmt: skip
            (d / n).write_bytes(blob)
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--level", default="x86-64-v4")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--base", default="", help="git revision whose templates are variant 'base' (listed first)")
    ap.add_argument("--variant", action="append", default=[], help="NAME=-DX=1,-DY=2 (the working tree's templates)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--micro", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--cold", type=float, nargs="?", const=64.0, default=0.0, metavar="MB",
                    help="read a buffer of MB MiB (default 64) before every call")  # fmt: skip
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time per call, also on several threads")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mm_ab_"))
    libs: dict[str, ctypes.CDLL] = {}
    if args.base:
        libs["base"] = build("base", base_templates(args.base, work), args.level, [], work)
    for v in args.variant or ([] if args.base else ["tree="]):
        name, _, defs = v.partition("=")
        libs[name] = build(name, ROOT / "cpp_templates", args.level, [d for d in defs.split(",") if d], work)
    if args.base and not args.variant:
        libs["tree"] = build("tree", ROOT / "cpp_templates", args.level, [], work)
    for name, lib in libs.items():
        print(f"{name}: MR={lib.ab_mr()} NR={lib.ab_nr()} KC={lib.ab_kc()}", flush=True)
    if args.micro:
        for _ in range(3):
            # best of many ~1 ms runs: on a loaded machine some get the core to themselves
            peak = max(next(iter(libs.values())).ab_peak(100000) for _ in range(300))
            micro = {n: round(max(lib.ab_micro(lib.ab_kc(), 2000, 1) for _ in range(300)), 1) for n, lib in libs.items()}
            l2 = {n: round(max(lib.ab_micro(lib.ab_kc(), 2000, 24) for _ in range(300)), 1) for n, lib in libs.items()}
            print(f"1 thread: FMA peak {peak:.1f} GFLOP/s, micro-kernel {micro} (A in L2: {l2})", flush=True)
    cold = np.ones(int(args.cold * (1 << 20)) // 4, np.float32)
    torch: Any = None
    torch_tids = np.zeros(0, np.int64)
    if not args.no_torch:
        import torch

        # torch's threads: started by its first parallel call, before any variant's pool exists
        torch.set_num_threads(max(int(t) for t in args.threads.split(",")))
        x = torch.ones(256, 256)
        (x @ x).sum()
        torch_tids = np.array([int(t) for t in os.listdir("/proc/self/task")], np.int64)
    for threads in (int(t) for t in args.threads.split(",")):
        if torch is not None:
            torch.set_num_threads(threads)
        for shape in args.shapes.split(","):
            bench_shape(libs, torch, torch_tids, shape, threads, args.rounds, args.reps, cold, args.cpu_time)


def bench_shape(libs: dict[str, ctypes.CDLL], torch: Any, torch_tids: np.ndarray, shape: str, threads: int,
                rounds: int, reps: int, cold: np.ndarray, cpu_time: bool) -> None:  # fmt: skip
    """One line: every variant (and torch.addmm + GELU, unless ``torch`` is None) on one shape. ``cold``
    (empty: none) is read before every call; ``cpu_time`` times calls by their threads' CPU time (torch's:
    ``torch_tids``)."""
    gelu = {"g": 1, "t": 2}.get(shape[-1], 0)
    m, n, k = (int(v) for v in shape.rstrip("gt").split("x"))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    fns: dict[str, Callable[[], float]] = {}
    outs: dict[str, np.ndarray] = {}
    packs: list[np.ndarray] = []  # alive while the calls run
    for name, lib in libs.items():
        nr = lib.ab_nr()
        # 64-byte aligned as a package's weights are (numpy's large arrays sit 16 bytes past a page, and
        # every vector load of a panel row would then straddle two cache lines)
        packed = aligned_empty(-(-n // nr) * k * nr * 4).view(np.float32).reshape(-(-n // nr), k, nr)
        packs.append(packed)
        lib.ab_pack(k, n, w.ctypes.data, packed.ctypes.data)
        outs[name] = out = np.empty((m, n), np.float32)
        timer = 2 if cpu_time else 1 if threads == 1 else 0  # ab_mm's clock
        args = (m, n, k, a.ctypes.data, packed.ctypes.data, bias.ctypes.data, out.ctypes.data, gelu, threads, reps,
                timer, cold.ctypes.data, cold.nbytes)  # fmt: skip
        fns[name] = functools.partial(lib.ab_mm, *args)
    if torch is not None:
        ta, tw, tb = torch.from_numpy(a), torch.from_numpy(w), torch.from_numpy(bias)
        tcold = torch.from_numpy(cold)
        clock: Callable[[], float] = time.thread_time if threads == 1 else time.perf_counter  # as ab_mm
        if cpu_time:  # the CPU time of the threads torch runs on: not time.process_time (see ab_mm)
            lib0 = next(iter(libs.values()))

            def clock() -> float:
                return float(lib0.ab_tids_ns(torch_tids.ctypes.data, torch_tids.size)) * 1e-9

        def tcall() -> float:
            best = 1e30
            for _ in range(reps):
                if cold.size:
                    tcold.sum()  # on torch's threads, as ab_evict on the library's
                t0 = clock()
                y = torch.addmm(tb, ta, tw)
                if gelu:
                    torch.nn.functional.gelu(y, approximate="tanh" if gelu == 2 else "none")
                best = min(best, clock() - t0)
            return best

        fns["torch"] = tcall
    for fn in fns.values():
        fn()  # warm
        time.sleep(SETTLE_S)
    if not gelu:
        want = a.astype(np.float64) @ w + bias
        for name, out in outs.items():
            err = np.abs(out - want).max() / np.abs(want).max()
            assert err < 1e-4, f"{name} at {shape}: relative error {err}"
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(SETTLE_S)
            times[name].append(fn())
    flop = 2.0 * m * n * k
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    first = next(iter(med))
    cells = "  ".join(f"{name} {flop / t * 1e-9:6.1f} GF/s {med[first] / t:5.2f}x (best {best[first] / best[name]:4.2f}x)"
                      for name, t in med.items())  # fmt: skip
    print(f"{threads}t {shape:>16}: {cells}", flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
