"""CPU latency: aotc packages next to eager torch (and ONNX Runtime when installed), same process, same inputs.

    python benchmarks/cpu_latency.py [OUT.json] [--threads N]

Models are the fixed CPU reference set that every run is compared with: an MLP 1024-4096-4096-1024 at
64x1024, a small ResNet-style CNN at 4x3x224x224 (examples/cnn.py's network), and a 4-layer BERT (hidden
256) at 4x128. Prints a table of medians over repeats and writes JSON with versions, threads and date.
Compare ratios within one run.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_timing import median_ms
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
REPEATS, MIN_TIME = 7, 0.3



def _median_ms(fn) -> float:  # type: ignore[no-untyped-def]
    return median_ms(fn, repeats=REPEATS, min_time=MIN_TIME)


def _models() -> list[tuple[str, nn.Module, tuple[torch.Tensor, ...], dict]]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024)).eval()
    spec = importlib.util.spec_from_file_location("cnn_example", ROOT / "examples" / "cnn.py")
    assert spec and spec.loader
    cnn_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cnn_mod)
    import transformers

    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                  intermediate_size=1024)  # fmt: skip
    sys.path.insert(0, str(ROOT / "tests"))
    from zoo.models import FirstOutput

    bert = FirstOutput(transformers.BertModel(cfg).eval())
    batch = torch.export.Dim("batch", min=1, max=64)
    return [
        ("mlp_1024_4096", mlp, (torch.randn(64, 1024),), {"x": {0: batch}}),
        ("cnn_small_resnet", cnn_mod.model, (torch.randn(4, 3, 224, 224),), {"x": {0: batch}}),
        ("bert_4l_256", bert, (torch.randint(0, 30522, (4, 128)),), {"x": {0: batch}}),
    ]


def _ort(model: nn.Module, xs: tuple[torch.Tensor, ...], threads: int):  # type: ignore[no-untyped-def]
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    path = Path(tempfile.mkdtemp()) / "m.onnx"
    try:
        torch.onnx.export(model, xs, str(path), dynamo=False, opset_version=17)
    except Exception as e:
        print("onnx export failed:", type(e).__name__, str(e)[:200])
        return None
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), xs, strict=True)}
    return lambda: sess.run(None, feed)


def main() -> None:
    import aotc
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, parse_target

    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else os.cpu_count() or 1
    torch.set_num_threads(threads)
    out = Path(next((a for a in sys.argv[1:] if a.endswith(".json")), "cpu_latency.json"))
    rows = []
    for name, model, xs, dyn in _models():
        tmp = Path(tempfile.mkdtemp())
        t0 = time.perf_counter()
        cap = capture_module(model, xs, tuple(dyn.values()), name=name)
        target = parse_target("cpu:native")
        build_captured(cap, tmp / f"{name}.pkg", BuildOptions(targets=(target,), selftest=False))
        build_s = time.perf_counter() - t0
        m = aotc.load(tmp / f"{name}.pkg", device="cpu", num_threads=threads)
        np_xs = [x.numpy() for x in xs]
        with torch.no_grad():
            want = model(*xs).numpy()
        err = float(np.abs(m(*np_xs) - want).max() / max(np.abs(want).max(), 1e-6))
        row = {"model": name, "target": str(target), "build_s": round(build_s, 1), "max_rel_err": err}
        row["aotc_ms"] = _median_ms(lambda m=m, np_xs=np_xs: m(*np_xs))
        with torch.no_grad():
            row["torch_eager_ms"] = _median_ms(lambda model=model, xs=xs: model(*xs))
        ort_fn = _ort(model, xs, threads)
        if ort_fn is not None:
            row["onnxruntime_ms"] = _median_ms(ort_fn)
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": platform.processor() or platform.machine(), "threads": threads, "torch": torch.__version__,
        "method": f"median of {REPEATS} repeats of >= {MIN_TIME}s each, after a warm-up; numpy in/out", "rows": rows,
    }  # fmt: skip
    out.write_text(json.dumps(doc, indent=1))
    print(f"{'model':18s} {'aotc':>9s} {'eager':>9s} {'ORT':>9s}")
    for r in rows:
        ort_ms = f"{r['onnxruntime_ms']:9.2f}" if "onnxruntime_ms" in r else f"{'-':>9s}"
        print(f"{r['model']:18s} {r['aotc_ms']:9.2f} {r['torch_eager_ms']:9.2f} {ort_ms}")


if __name__ == "__main__":
    main()
