"""Build time: how long `aotc build` takes per stage, with a cold and a warm kernel cache.

    python benchmarks/build_time.py [OUT.json] [--real NAME ...]

Default models: the three examples and BERT-base / ResNet-50 at real size from `transformers` configs
(random weights). Targets cpu:x86-64-v3 and cuda:sm_90 (cross-compiled: no GPU needed). Each model is built
twice into fresh packages: first with an empty kernel cache (what a user's first build costs), then with the
cache the first build filled (a rebuild after editing model.py). Prints a table and writes JSON with the
machine, versions and date. Stage times come from BuildReport.seconds, the same figures `aotc build` prints.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
TARGETS = "cpu:x86-64-v3,cuda:sm_90"
REAL = ["bert_base", "hf_resnet50"]


def _captures(real: list[str]):  # type: ignore[no-untyped-def]
    """(name, seconds to capture, Captured) for the examples and the named real-size zoo models."""
    import time

    from aotc_build.capture import capture, capture_module
    from zoo.models import REAL as ZOO_REAL
    from zoo.models import real_dynamic, real_inputs, real_module

    for name in ("mlp", "cnn", "transformer"):
        t0 = time.perf_counter()
        cap = capture(ROOT / "examples" / f"{name}.py")
        yield name, time.perf_counter() - t0, cap
    for m in ZOO_REAL:
        if m.name in real:
            torch.manual_seed(0)
            model = real_module(m)
            b, s = m.shapes[0]
            t0 = time.perf_counter()
            cap = capture_module(model, real_inputs(m, b, s), real_dynamic(m), name=m.name)
            yield m.name, time.perf_counter() - t0, cap


def main() -> None:
    from aotc_build.build import build_captured
    from aotc_build.options import BuildOptions, parse_target

    args = sys.argv[1:]
    out = Path(args[0]) if args and not args[0].startswith("--") else None
    real = args[args.index("--real") + 1 :] if "--real" in args else REAL
    options = BuildOptions(targets=tuple(parse_target(t) for t in TARGETS.split(",")))
    rows = []
    print(f"{'model':12s} {'cache':5s} {'total s':>8s}  stages (s)")
    for name, capture_s, cap in _captures(real):
        with tempfile.TemporaryDirectory(prefix="aotc-bench-build-") as tmp:
            for cache in ("cold", "warm"):
                seconds = {"capture": capture_s}
                report = build_captured(cap, Path(tmp) / f"{name}.pkg", options, Path(tmp) / "cache", seconds)
                row = {"model": name, "cache": cache, "kernels": report.kernels, "weights_mb": report.weights_bytes / 2**20,
                       "total_s": sum(report.seconds.values()), "stages_s": report.seconds}  # fmt: skip
                rows.append(row)
                stages = ", ".join(f"{k} {v:.2f}" for k, v in report.seconds.items())
                print(f"{name:12s} {cache:5s} {row['total_s']:8.2f}  {stages}", flush=True)
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "triton": importlib.util.find_spec("triton") and __import__("triton").__version__,
        "targets": TARGETS, "method": "one build per row; warm = the same model again with the cache the cold build filled",
        "rows": rows,
    }  # fmt: skip
    if out:
        out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
