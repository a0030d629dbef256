"""Per-kernel CPU time of an aotc package: where a model's milliseconds go, kernel by kernel.

    python benchmarks/cpu_profile.py [--model bert] [--target cpu:native] [--calls 20] [--threads N] [--top 25]
                                     [--precision bf16]

Builds one of cpu_side_by_side.py's models with its C++ instrumented: each kernel call in ``aotc_run``
is bracketed by ``omp_get_wtime`` and the seconds summed per kernel into a table the library exports as
``aotc_prof_read``. The instrumented library is loaded with ctypes (the runtime's executor cannot read an
extra symbol), fed the package's weights, packed weights and arena, run ``--calls`` times after a warm-up,
and the kernels are printed by total time with their kind (Matmul, Attention, Reduce, Pointwise, ...),
then the time per kind. The instrumentation only adds two clock reads per kernel; the whole-call time is
printed next to the sum so the overhead shows.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from cpu_side_by_side import MODELS, prepared  # noqa: E402

CALL = re.compile(r"^(\s+)(aotc_k_\w+)\((.*)\);$")


def instrument(source: str, kinds: list[str]) -> str:
    """``source`` with every kernel call of aotc_run timed into ``aotc_prof[j]``: CPU seconds of the whole
    process (every thread's, spin-waits included) under AOTC_PROF_CPU=1 in the environment, else wall."""
    out, j = ["#include <time.h>", "#include <stdlib.h>"], 0
    head = "AOTC_EXPORT int32_t aotc_run("
    for line in source.split("\n"):
        if line.startswith(head):
            out.append(f"static double aotc_prof[{max(len(kinds), 1)}];")
            out.append("static double aotc_clock() {")
            out.append("  static const bool cpu = getenv(\"AOTC_PROF_CPU\") != nullptr;")
            out.append("  if (!cpu) return omp_get_wtime();")
            out.append("  timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec;")
            out.append("}")
            out.append('extern "C" __attribute__((visibility("default"))) void aotc_prof_read(double* o) {')
            out.append(f"  for (int i = 0; i < {len(kinds)}; ++i) {{ o[i] = aotc_prof[i]; aotc_prof[i] = 0; }}")
            out.append("}")
        m = CALL.match(line)
        if m:
            out.append(f"{m[1]}{{ const double aotc_t = aotc_clock(); {m[2]}({m[3]}); aotc_prof[{j}] += aotc_clock() - aotc_t; }}")
            j += 1
        else:
            out.append(line)
    assert j == len(kinds), f"found {j} kernel calls, expected {len(kinds)}"
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert", choices=list(MODELS))
    ap.add_argument("--target", default="cpu:native")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--cpu-time", action="store_true", help="CPU time of the process instead of wall time (a loaded machine)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: the model and its package in bfloat16")
    ap.add_argument("--source", type=Path, default=None, help="also write the generated C++ here")
    args = ap.parse_args()
    if args.cpu_time:
        os.environ["AOTC_PROF_CPU"] = "1"

    import aotc
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.codegen import cpp
    from aotc_build.options import BuildOptions, parse_target

    kinds: list[str] = []  # per kernel function aotc_run calls (an inverted-residual block is one: "Block")
    names: list[str] = []
    plain = cpp.generate

    def generate(prog, options, *rest):  # type: ignore[no-untyped-def]
        src = plain(prog, options, *rest)
        by_fn = {f"aotc_k_{k.name}": type(k).__name__ for k in prog.kernels}
        names[:] = [m[2] for m in map(CALL.match, src.split("\n")) if m]
        kinds[:] = ["Block" if n.endswith("_block") else by_fn.get(n, "?") for n in names]
        if args.source:
            args.source.write_text(src)
        return instrument(src, kinds)

    cpp.generate = generate
    title, make, inputs = MODELS[args.model]
    model, x = prepared(make, inputs)
    if args.precision == "bf16":
        import torch

        model = model.to(torch.bfloat16)
        x = x.to(torch.bfloat16) if x.is_floating_point() else x
    work = Path(tempfile.mkdtemp(prefix="prof_"))
    pkg = work / "m.pkg"
    cap = capture_module(model, (x,), name=args.model, precision=args.precision)
    build_captured(cap, pkg, BuildOptions(targets=(parse_target(args.target),), selftest=False, precision=args.precision))
    m = aotc.load(pkg, device="cpu", num_threads=args.threads)
    ex = m.executor
    so = work / "model.so"
    so.write_bytes(m.package.read(ex.spec.library))
    lib = ctypes.CDLL(str(so))
    lib.aotc_set_num_threads(args.threads)

    bf16_in = args.precision == "bf16" and x.is_floating_point()
    xn = np.ascontiguousarray(x.float().numpy().astype(ml_dtypes.bfloat16) if bf16_in else x.numpy())
    outs = [np.empty(s.shape, aotc.schema.numpy_dtype(s.dtype)) for s in m.outputs]  # fixed shapes: the bench models are static
    arena = aotc.package.aligned_empty(int(ex.spec.arena_bytes) + 64) if isinstance(ex.spec.arena_bytes, int) else None
    assert arena is not None, "a package with a symbolic arena size"
    P = ctypes.c_void_p
    ins = (P * 1)(xn.ctypes.data)
    outp = (P * len(outs))(*[o.ctypes.data for o in outs])
    ws = (P * max(len(ex._weights), 1))(*[w.ctypes.data for w in ex._weights])
    err = ctypes.create_string_buffer(4096)
    syms = (ctypes.c_int64 * 1)(0)

    def call() -> None:
        rc = lib.aotc_run(syms, ins, outp, ws, P(arena.ctypes.data), err, ctypes.c_size_t(4096))
        assert rc == 0, err.value

    prof = (ctypes.c_double * max(len(kinds), 1))()
    call()
    lib.aotc_prof_read(prof)
    walls = []
    for _ in range(args.calls):
        t = time.perf_counter()
        call()
        walls.append(time.perf_counter() - t)
    lib.aotc_prof_read(prof)
    ms = [prof[i] * 1e3 / args.calls for i in range(len(kinds))]
    total = sum(ms)
    print(f"{title}, {ex.target}, {args.threads} threads, {'CPU' if args.cpu_time else 'wall'} time, load {os.getloadavg()[0]:.1f}: "
          f"kernels {total:.2f} ms a call (wall: mean {np.mean(walls) * 1e3:.2f}, median {np.median(walls) * 1e3:.2f})")  # fmt: skip
    by_name: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for n, kd, t in zip(names, kinds, ms, strict=True):
        by_name[(re.sub(r"_\d+$", "", n), kd)].append(t)
    rows = sorted(((sum(v), len(v), n, kd) for (n, kd), v in by_name.items()), reverse=True)
    for t, cnt, n, kd in rows[: args.top]:
        print(f"  {t:8.3f} ms {100 * t / total:5.1f}%  x{cnt:<3d} {kd:10s} {n}")
    per_kind: dict[str, float] = collections.defaultdict(float)
    for kd, t in zip(kinds, ms, strict=True):
        per_kind[kd] += t
    print("  by kind: " + ", ".join(f"{kd} {t:.2f} ms ({100 * t / total:.0f}%)" for kd, t in sorted(per_kind.items(), key=lambda r: -r[1])))


if __name__ == "__main__":
    main()
