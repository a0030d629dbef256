"""CPU contention: aotc packages idle and while another process keeps one core busy, adaptive and fixed threads.

    python benchmarks/cpu_contention.py [--models mlp_small,mlp,cnn,bert,mobilenet,gpt2_1,gpt2_4]
                                        [--target cpu:native] [--pkg-dir DIR] [--calls 15] [--rounds 3]
                                        [--neighbour] [--bursts ON:PERIOD] [--baseline DIR] [--build-only]
                                        [--out FILE.json]

Edge servers run other processes too: a call that splits its work over two threads must not become
slower than one thread when one of the cores is taken, and the policy that notices it (cpp_templates/
aotc_pool.h) must cost nothing when the cores are free. Per model this builds one package for --target (the
models of cpu_side_by_side.py, plus ``mlp_small``: examples/mlp.py at 1x256, where 2 threads once took 16 ms
a call against 1.4 on one), loads it three times and times, interleaved:
  idle:          ``auto`` (the default: every core, the adaptive policy on), ``fixed2`` (exactly 2 threads,
                 no policy: the raw mechanism), ``1`` (one thread);
  one core busy: ``auto`` and ``1``, while another process spins (bench_timing.busy_core);
  --bursts ON:PERIOD: all three while the other process spins ON ms of every PERIOD ms (a neighbour
                 that comes and goes: auto should stay near fixed2 there, not fall to one thread's time).
--neighbour adds an ONNX Runtime session of the same model (its own threads, as many as the cores) to the same
process, called before each aotc variant in every round: its threads spin for ~20 ms after its calls, the
situation of cpu_side_by_side.py, where the policy must not mistake them for a busy core; ``ort`` is timed too.
Each cell: the median of --calls single calls, best of --rounds interleaved rounds, in ms; with each
variant's pool counters (calls, loops, stalls, drops to one thread, solo calls, worker wake-ups). Before/after
in one process: build the old side's packages with the old checkout (``--build-only --pkg-dir OLD``), then
time both with --baseline OLD (``base_auto``). Writes JSON with the CPU, its flags, versions, load and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_timing import bursts_arg, busy_core
from cpu_side_by_side import MODELS, ROOT, _cpu, _ort, _versions, prepared


def _mlp_small() -> torch.nn.Module:
    import importlib.util

    spec = importlib.util.spec_from_file_location("mlp_example", ROOT / "examples" / "mlp.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.model


ALL = {**MODELS, "mlp_small": ("examples/mlp.py (1x256)", _mlp_small, lambda: torch.randn(1, 256))}
IDLE = ("auto", "fixed2", "1")
BUSY = ("auto", "1")


def _package(key: str, pkg_dir: Path, target: str) -> Path:
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, parse_target

    pkg = pkg_dir / f"{key}.pkg"
    if not pkg.exists():
        model, x = prepared(*ALL[key][1:])
        cap = capture_module(model, (x,), name=key)
        build_captured(cap, pkg, BuildOptions(targets=(parse_target(target),), selftest=False))
    return pkg


def _load(pkg: Path, variant: str) -> object:
    import aotc

    m = aotc.load(pkg, device="cpu", num_threads=1 if variant == "1" else None)
    if variant == "fixed2":
        m.executor.set_threads(2, fixed_threads=True)
    return m


def _rounds(fns: dict[str, Callable[[], object]], models: dict, calls: int, rounds: int, before: Callable[[], object] | None) -> dict:
    """Best of ``rounds`` interleaved rounds of the median of ``calls`` single calls (ms), and each aotc
    variant's pool counters over all of them (per call). ``before`` runs ahead of every variant's turn."""
    best = dict.fromkeys(fns, math.inf)
    start = {k: m.executor.pool_stats() for k, m in models.items()}
    for _ in range(rounds):
        for name, fn in fns.items():
            if before is not None and name != "ort":
                before()
            fn()
            ts = []
            for _ in range(calls):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            best[name] = min(best[name], statistics.median(ts) * 1e3)
    out: dict = {"ms": {k: round(v, 3) for k, v in best.items()}, "pool": {}}
    for k, m in models.items():
        end = m.executor.pool_stats()
        if start[k] is None or end is None:
            continue
        d = {s: end[s] - start[k][s] for s in end}
        n = max(d["calls"], 1)
        out["pool"][k] = {
            "calls": d["calls"], "loops_per_call": round(d["loops"] / n, 1), "stalls": d["stalls"], "drops": d["drops"],
            "solo_calls": d["solo_calls"], "probes": d["probes"], "explores": d["explores"],
            "busy_skips": d.get("busy_skips", 0), "moves": d.get("moves", 0), "pulls": d.get("pulls", 0),
            "wakes_per_call": round(d["wakes"] / n, 2),
            "wait_ms_per_call": round(d["wait_ns"] / n / 1e6, 3), "worker_share": round(d["worker_chunks"] / max(d["chunks"], 1), 3),
        }  # fmt: skip
    return out


def bench(key: str, pkg_dir: Path, target: str, calls: int, rounds: int, neighbour: bool, baseline: Path | None,
          bursts: tuple[float, float] | None = None) -> dict:  # fmt: skip
    title, make, inputs = ALL[key]
    torch.manual_seed(1)
    xt = inputs()
    x = xt.numpy()
    pkg = _package(key, pkg_dir, target)
    models = {name: _load(pkg, name) for name in IDLE}
    if baseline is not None:  # the same model built by an older aotc
        models["base_auto"] = _load(baseline / f"{key}.pkg", "auto")
    outs = {name: np.asarray(m(x)) for name, m in models.items()}
    err = max(float(np.abs(o - outs["1"]).max()) for o in outs.values())
    fns: dict[str, Callable[[], object]] = {name: (lambda m=m: m(x)) for name, m in models.items()}
    before = None
    if neighbour:
        fns["ort"] = before = _ort(prepared(make, inputs)[0], xt, Path(tempfile.mkdtemp(prefix="contention_")), os.cpu_count() or 1)
    row: dict = {"model": key, "title": title, "max_abs_diff_between_variants": err, "loadavg_1min": os.getloadavg()[0]}
    row["idle"] = _rounds(fns, models, calls, rounds, before)
    busy = {k: v for k, v in fns.items() if k in BUSY or k.startswith("base_")}
    with busy_core():
        row["one_core_busy"] = _rounds(busy, {k: m for k, m in models.items() if k in busy}, calls, rounds, before)
    if bursts is not None:
        with busy_core(bursts):
            row["bursts"] = _rounds(fns, models, calls, rounds, before)
        row["bursts_auto_over_fixed2"] = round(row["bursts"]["ms"]["auto"] / row["bursts"]["ms"]["fixed2"], 3)
    idle_ms, busy_ms = row["idle"]["ms"], row["one_core_busy"]["ms"]
    row["idle_auto_over_fixed2"] = round(idle_ms["auto"] / idle_ms["fixed2"], 3)
    row["busy_auto_over_1"] = round(busy_ms["auto"] / busy_ms["1"], 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mlp_small,mlp,cnn,bert,mobilenet,gpt2_1,gpt2_4")
    ap.add_argument("--target", default="cpu:native", help="the packages' CPU target (cpu:x86-64-v3: the AVX2 code)")
    ap.add_argument("--pkg-dir", type=Path, default=Path("/tmp/aotc_contention"))
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--neighbour", action="store_true", help="an ONNX Runtime session in the process, called before each variant")
    ap.add_argument("--bursts", type=bursts_arg, default=None, metavar="ON:PERIOD",
                    help="also time every variant while a process spins ON ms of every PERIOD ms (e.g. 5:20)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="JSON (default: benchmarks/results/cpu_contention_<date>.json)")
    ap.add_argument("--baseline", type=Path, default=None, help="also time the packages here (an older aotc's, --build-only) as base_auto")
    ap.add_argument("--build-only", action="store_true", help="build the packages into --pkg-dir and stop")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a kill still stops the busy process (finally)
    args.pkg_dir.mkdir(parents=True, exist_ok=True)
    keys = [k.strip() for k in args.models.split(",")]
    if args.build_only:
        for key in keys:
            print(_package(key, args.pkg_dir, args.target), flush=True)
        return
    torch.set_num_threads(os.cpu_count() or 1)
    doc: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": _cpu(),
        "cores": len(os.sched_getaffinity(0)), "target": args.target, "versions": _versions(),
        "busy": "one unpinned process spinning (bench_timing.busy_core)", "neighbour": "onnxruntime" if args.neighbour else None,
        "method": f"median of {args.calls} calls, best of {args.rounds} interleaved rounds; ms",
        "loadavg_start": os.getloadavg(), "rows": [],
    }  # fmt: skip
    bursts = args.bursts
    doc["bursts_ms"] = bursts
    for key in keys:
        row = bench(key, args.pkg_dir, args.target, args.calls, args.rounds, args.neighbour, args.baseline, bursts)
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
    doc["loadavg_end"] = os.getloadavg()
    out = args.out or ROOT / "benchmarks" / "results" / f"cpu_contention_{doc['date'][:10]}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    states = ("idle", "one_core_busy", "bursts") if bursts else ("idle", "one_core_busy")
    cols = [(s, n) for s in states for n in doc["rows"][0][s]["ms"]]
    extra = "  bursts auto/fixed2" if bursts else ""
    print(f"\n{'model':10s} " + " ".join(f"{s[:4] + ' ' + n:>14s}" for s, n in cols) + "  auto/fixed2  busy auto/1" + extra)
    for r in doc["rows"]:
        cells = " ".join(f"{r[s]['ms'].get(n, float('nan')):14.2f}" for s, n in cols)
        tail = f" {r['bursts_auto_over_fixed2']:19.3f}" if bursts else ""
        print(f"{r['model']:10s} {cells} {r['idle_auto_over_fixed2']:12.3f} {r['busy_auto_over_1']:12.3f}{tail}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
