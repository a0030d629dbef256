"""CPU contention: aotc packages idle and while another process keeps one core busy, at 1, 2 and auto threads.

    python benchmarks/cpu_contention.py [--models mlp_small,mlp,cnn,bert,mobilenet,gpt2_1,gpt2_4]
                                        [--pkg-dir DIR] [--calls 15] [--rounds 3] [--pin] [--out FILE.json]
                                        [--baseline DIR] [--build-only]

Edge servers run other processes too: a call that splits its work over two threads must not become
slower than one thread when one of the cores is taken. Per model this builds one cpu:native package (the
models of cpu_side_by_side.py, plus ``mlp_small``: examples/mlp.py at 1x256, the issue's report), loads it
three times -- ``1`` (one thread), ``2`` (two threads, adaptation off: the raw mechanism) and ``auto`` (the
default: every core, the runtime's adaptive policy on) -- and times the three interleaved, idle and with a
busy process (``while True: pass``; with --pin it is pinned to the last core this process may use, else
the scheduler places it). On a big host, ``taskset -c 0,1 python ...`` makes it a 2-core machine.
Each cell: the median of --calls single calls, best of --rounds interleaved rounds, in ms. Packages are
kept in --pkg-dir (built when absent). Before/after in one process, under the same load: build the old
side's packages with the old checkout (``--build-only --pkg-dir OLD``), then time both with --baseline OLD.
Writes JSON with the machine's load average, the CPU and the date.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_side_by_side import MODELS, ROOT


def _mlp_small() -> torch.nn.Module:
    import importlib.util

    spec = importlib.util.spec_from_file_location("mlp_example", ROOT / "examples" / "mlp.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.model


ALL = {**MODELS, "mlp_small": ("examples/mlp.py (1x256)", _mlp_small, lambda: torch.randn(1, 256))}
VARIANTS = {"1": 1, "2": 2, "auto": 0}


def _package(key: str, pkg_dir: Path) -> Path:
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, parse_target

    pkg = pkg_dir / f"{key}.pkg"
    if not pkg.exists():
        _, make, inputs = ALL[key]
        torch.manual_seed(0)
        cap = capture_module(make().eval(), (inputs(),), name=key)
        build_captured(cap, pkg, BuildOptions(targets=(parse_target("cpu:native"),), selftest=False))
    return pkg


def _load(pkg: Path, threads: int, adaptive: bool) -> Callable[..., object]:
    import aotc
    from aotc.cpu import CpuExecutor, select_target
    from aotc.model import Model
    from aotc.package import Package

    if adaptive:
        return aotc.load(pkg, device="cpu", num_threads=threads)
    package = Package(pkg)
    target = select_target(package.manifest.cpu_targets)
    return Model(package, CpuExecutor(package, target, num_threads=threads, fixed_threads=True))


@contextlib.contextmanager
def busy_core(pin: bool) -> Iterator[None]:
    cmd = [sys.executable, "-c", "while True: pass"]
    if pin:
        cmd = ["taskset", "-c", str(max(os.sched_getaffinity(0))), *cmd]  # the last core this process may use
    p = subprocess.Popen(cmd)
    try:
        time.sleep(0.3)
        yield
    finally:
        p.kill()
        p.wait()


def _rounds(fns: dict[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, float]:
    best = dict.fromkeys(fns, math.inf)
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()
            ts = []
            for _ in range(calls):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            best[name] = min(best[name], statistics.median(ts) * 1e3)
    return {k: round(v, 3) for k, v in best.items()}


def bench(key: str, pkg_dir: Path, calls: int, rounds: int, pin: bool, baseline: Path | None) -> dict:
    title, _, inputs = ALL[key]
    torch.manual_seed(1)
    x = inputs().numpy()
    pkg = _package(key, pkg_dir)
    models = {name: _load(pkg, n, adaptive=name == "auto") for name, n in VARIANTS.items()}
    if baseline is not None:  # packages of an older aotc (OpenMP regions): plain thread counts
        for name, n in VARIANTS.items():
            models[f"base_{name}"] = _load(baseline / f"{key}.pkg", n, adaptive=True)
    outs = {name: np.asarray(m(x)) for name, m in models.items()}
    ref = outs["1"]
    err = max(float(np.abs(o - ref).max()) for o in outs.values())
    fns = {name: (lambda m=m: m(x)) for name, m in models.items()}
    row: dict = {"model": key, "title": title, "max_abs_diff_between_variants": err}
    row["idle"] = _rounds(fns, calls, rounds)
    with busy_core(pin):
        row["one_core_busy"] = _rounds(fns, calls, rounds)
    busy = row["one_core_busy"]
    row["busy_auto_over_1"] = round(busy["auto"] / busy["1"], 3)
    row["busy_2_over_1"] = round(busy["2"] / busy["1"], 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mlp_small,mlp,cnn,bert,mobilenet,gpt2_1,gpt2_4")
    ap.add_argument("--pkg-dir", type=Path, default=Path("/tmp/aotc_contention"))
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pin", action="store_true", help="pin the busy process to the last core")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="also time the packages in this directory (built by an older aotc with --build-only), as base_1, base_2, base_auto",
    )
    ap.add_argument("--build-only", action="store_true", help="build the packages into --pkg-dir and stop")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a kill still stops the busy process (finally)
    args.pkg_dir.mkdir(parents=True, exist_ok=True)
    doc: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)), "busy": "pinned to the last core" if args.pin else "one unpinned busy process",
        "method": f"median of {args.calls} calls, best of {args.rounds} interleaved rounds; ms",
        "loadavg_start": os.getloadavg(), "rows": [],
    }  # fmt: skip
    with contextlib.suppress(OSError):
        doc["cpu"] = next(
            ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")
        )
    if args.build_only:
        for key in args.models.split(","):
            print(_package(key.strip(), args.pkg_dir), flush=True)
        return
    for key in args.models.split(","):
        row = bench(key.strip(), args.pkg_dir, args.calls, args.rounds, args.pin, args.baseline)
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
    doc["loadavg_end"] = os.getloadavg()
    names = list(doc["rows"][0]["idle"]) if doc["rows"] else []
    print(f"\n{'model':10s} {'state':6s} " + " ".join(f"{n:>10s}" for n in names))
    for r in doc["rows"]:
        for state in ("idle", "one_core_busy"):
            print(f"{r['model']:10s} {state[:6]:6s} " + " ".join(f"{r[state][n]:10.2f}" for n in names))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
