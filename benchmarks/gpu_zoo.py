"""Real-size models on the GPU: correctness against eager torch on CUDA and latency next to torch.

    python benchmarks/gpu_zoo.py ref   DIR [NAMES...] [--compile]   # torch on CUDA: inputs, eager outputs, timings
    CUDA_VISIBLE_DEVICES= python benchmarks/gpu_zoo.py build DIR [NAMES...]   # aotc build, GPU hidden
    python benchmarks/gpu_zoo.py run   DIR OUT.json     # the runtime alone (torch never imported)

Real-size weights (100+ MB a model) cannot travel to the device machine, so ``build`` runs on the device
host with its GPU hidden from the process: the builder never touches a GPU (cross-compiled cubins, no
autotuning), exactly as on a build machine. Small-config zoo packages built on a GPU-less machine run in
tests/gpu/test_packages_gpu.py. Each model: fp32 (TF32 off, rtol 1e-4) and bf16 (rtol 2e-2).
tests/gpu/on_device.sh drives the three steps on the device machine.
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
from bench_timing import median_ms

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
WARMUP, CALLS, REPEATS = 10, 50, 5
PRECISIONS = ("fp32", "bf16")
# torch.compile(mode="reduce-overhead") beside eager costs a minute a model to compile, so it is opt-in
COMPILE = "--compile" in sys.argv



def _median_ms(fn) -> float:  # type: ignore[no-untyped-def]
    return median_ms(fn, repeats=REPEATS, calls=CALLS, warmup=WARMUP)


def _models(names: list[str]):  # type: ignore[no-untyped-def]
    from zoo.models import REAL

    return [m for m in REAL if not names or m.name in names]


def ref(out: Path, names: list[str]) -> None:
    import ml_dtypes
    import torch
    from zoo.models import real_inputs, real_module

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out.mkdir(parents=True, exist_ok=True)
    timings = {}
    for m in _models(names):
        for precision in PRECISIONS:
            dt = torch.float32 if precision == "fp32" else torch.bfloat16
            torch.manual_seed(0)
            model = real_module(m).to("cuda", dt)
            torch.save(model.state_dict(), out / f"{m.name}.weights.pt") if precision == "fp32" else None
            arrays = {}
            for k, (b, s) in enumerate(m.shapes):
                torch.manual_seed(100 + k)
                xs = [x.cuda() for x in real_inputs(m, b, s)]
                xs = [x.to(dt) if x.is_floating_point() else x for x in xs]
                with torch.no_grad():
                    y = model(*xs).float().cpu().numpy()
                    if precision == "bf16":  # the fp32 truth, to tell bf16 rounding from a wrong answer
                        f32 = real_module(m).to("cuda")
                        f32.load_state_dict(torch.load(out / f"{m.name}.weights.pt"))
                        arrays[f"out32.{k}"] = f32(*[x.float() if x.is_floating_point() else x for x in xs]).cpu().numpy()
                        del f32
                for i, x in enumerate(xs):
                    a = x.float().cpu().numpy() if x.is_floating_point() else x.cpu().numpy()
                    if precision == "bf16" and a.dtype == np.float32:
                        a = a.astype(ml_dtypes.bfloat16).view(np.uint16)  # npz keeps bf16 as raw bits
                    arrays[f"in.{k}.{i}"] = a
                arrays[f"out.{k}"] = y
                if k == 0:
                    def call(model=model, xs=xs) -> None:  # type: ignore[no-untyped-def]
                        with torch.no_grad():
                            model(*xs)
                        torch.cuda.synchronize()

                    row = {"eager_ms": _median_ms(call)}
                    if not COMPILE:
                        timings[f"{m.name}.{precision}"] = row
                        print(m.name, precision, row, flush=True)
                        continue
                    try:
                        compiled = torch.compile(model, mode="reduce-overhead")
                        def ccall(compiled=compiled, xs=xs) -> None:  # type: ignore[no-untyped-def]
                            with torch.no_grad():
                                compiled(*xs)
                            torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        ccall()
                        row["compile_s"] = time.perf_counter() - t0
                        row["reduce_overhead_ms"] = _median_ms(ccall)
                    except Exception as e:
                        row["reduce_overhead_error"] = f"{type(e).__name__}: {e}"[:300]
                    timings[f"{m.name}.{precision}"] = row
                    print(m.name, precision, row, flush=True)
            np.savez(out / f"{m.name}.{precision}.ref.npz", **arrays)
    (out / "torch_timings.json").write_text(json.dumps({"torch": torch.__version__, "rows": timings}, indent=1))


def build(out: Path, names: list[str]) -> None:
    import torch
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target
    from zoo.models import real_dynamic, real_inputs, real_module

    assert not torch.cuda.is_available(), "build with the GPU hidden: CUDA_VISIBLE_DEVICES="
    for m in _models(names):
        torch.manual_seed(0)
        model = real_module(m)
        sd = out / f"{m.name}.weights.pt"
        if sd.exists():  # the same weights the reference run used
            model.load_state_dict(torch.load(sd, map_location="cpu"))
        for precision in PRECISIONS:
            t0 = time.perf_counter()
            b, s = m.shapes[0]
            cap = capture_module(model, real_inputs(m, b, s), real_dynamic(m), name=m.name, precision=precision)
            build_captured(cap, out / f"{m.name}.{precision}.pkg", BuildOptions(targets=(Target("cuda", "sm_90"),),
                           precision=precision, selftest=False), out / "cache")  # fmt: skip
            print(f"built {m.name} {precision} in {time.perf_counter() - t0:.1f} s", flush=True)


def run(out: Path, json_path: Path) -> None:
    import aotc
    import ml_dtypes

    torch_rows = json.loads((out / "torch_timings.json").read_text())
    rows = []
    for pkg in sorted(out.glob("*.pkg")):
        name, precision = pkg.stem.rsplit(".", 1)
        ref = np.load(pkg.with_name(f"{name}.{precision}.ref.npz"))
        t0 = time.perf_counter()
        model = aotc.load(pkg, device="cuda")
        load_ms = (time.perf_counter() - t0) * 1e3
        row: dict = {"model": name, "precision": precision, "load_ms": round(load_ms, 1)}
        errs, close = [], []
        tol = 1e-4 if precision == "fp32" else 2e-2
        k = 0
        while f"out.{k}" in ref:
            xs = []
            i = 0
            while f"in.{k}.{i}" in ref:
                x = ref[f"in.{k}.{i}"]
                xs.append(x.view(ml_dtypes.bfloat16) if x.dtype == np.uint16 else x)
                i += 1
            got = model(*xs).astype(np.float32)
            want = ref[f"out.{k}"]
            scale = max(float(np.abs(want).max()), 1e-6)
            errs.append(float(np.abs(got - want).max() / scale))
            # the criterion of tests/zoo and tests/gpu/test_packages_gpu.py: |got - want| <= tol * (max|want| + |want|)
            close.append(bool(np.allclose(got, want, rtol=tol, atol=tol * scale)))
            if f"out32.{k}" in ref:
                truth = ref[f"out32.{k}"]
                truth_scale = max(np.abs(truth).max(), 1e-6)
                row.setdefault("aotc_err_vs_fp32", []).append(float(np.abs(got - truth).max() / truth_scale))
                row.setdefault("eager_bf16_err_vs_fp32", []).append(float(np.abs(want - truth).max() / truth_scale))
            if k == 0:
                ex, env = model.executor, model.bind([x.shape for x in xs])
                dxs = [ex.to_device(x) for x in xs]
                row["plain_ms"] = _median_ms(lambda ex=ex, dxs=dxs, env=env: ex.run(dxs, env, device_outputs=True, graph=False))
                row["graph_ms"] = _median_ms(lambda ex=ex, dxs=dxs, env=env: ex.run(dxs, env, device_outputs=True, graph=True))
            k += 1
        row.update({"max_rel_err": errs, "tolerance": tol, "ok": all(close)})
        row.update(torch_rows["rows"].get(f"{name}.{precision}", {}))
        rows.append(row)
        print(json.dumps(row), flush=True)
        model.close()
    assert "torch" not in sys.modules
    from aotc import cuda

    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "device": cuda.device_info(), "torch_baseline": torch_rows["torch"],
           "method": f"median of {REPEATS}x{CALLS} calls after {WARMUP} warm-ups, device-resident inputs; "
                     "max_rel_err = max|aotc - eager| / max|eager| per shape; ok = allclose(rtol=tol, atol=tol*max|eager|) "
                     "at every shape", "rows": rows}  # fmt: skip
    json_path.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    cmd, d = sys.argv[1], Path(sys.argv[2])
    names = [a for a in sys.argv[3:] if not a.startswith("--")]
    if cmd == "ref":
        ref(d, names)
    elif cmd == "build":
        build(d, names)
    else:
        run(d, Path(sys.argv[3]))
