"""Convolutions on the GPU: aotc packages of ResNet-50-like conv blocks and torchvision resnet50 (8x3x224x224,
bf16 and fp32) against eager torch (cudnn.benchmark, channels_last), in one process, and the time of every
kernel of each package launched alone, so the slow convs show.

    python benchmarks/conv_gpu.py OUT.json [--dir DIR] [--only NAME,...] [--no-resnet] [--compile]

Step 1 builds every package in subprocesses with the GPU hidden (``CUDA_VISIBLE_DEVICES=``: cross-compiled
cubins, exactly as on a build machine; ``--build-one`` is that subprocess). Step 2, in this process: eager
torch and the package on the same weights and inputs, median wall clock per call with a synchronize, the
package's output checked against eager, then each kernel launched alone 50 times on the package's own
buffers (after one full call). fp32 on both sides is true fp32 (TF32 off). Aims to finish in < 5 minutes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_timing import median_ms

ROOT = Path(__file__).resolve().parents[1]
BATCH = 8
PRECISIONS = ("bf16", "fp32")


# ---- the models (built the same way, from the same seed, on both sides) --------------------------------


def _blocks() -> dict[str, tuple[Any, tuple[int, ...]]]:
    """name -> (module factory, input shape): the conv shapes ResNet-50 spends its time in, plus the
    depthwise convs of MobileNetV2 (3x3) and ConvNeXt (7x7)."""
    import torch
    from torch import nn

    def cbr(cin: int, cout: int, k: int, s: int = 1, groups: int = 1, relu: bool = True) -> nn.Module:
        layers = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, *([nn.ReLU()] if relu else []))

    class Residual(nn.Module):  # conv + bn + skip add + relu: the last 1x1 of a bottleneck
        def __init__(self, c: int, mid: int) -> None:
            super().__init__()
            self.body = nn.Sequential(cbr(c, mid, 1), cbr(mid, mid, 3), cbr(mid, c, 1, relu=False))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.body(x) + x)

    return {
        "stem7x7_s2": (lambda: nn.Sequential(cbr(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)), (BATCH, 3, 224, 224)),
        "c3x3_64_56": (lambda: cbr(64, 64, 3), (BATCH, 64, 56, 56)),
        "c1x1_64_256_56": (lambda: cbr(64, 256, 1), (BATCH, 64, 56, 56)),
        "c3x3_128_s2": (lambda: cbr(128, 128, 3, 2), (BATCH, 128, 56, 56)),
        "c3x3_256_14": (lambda: cbr(256, 256, 3), (BATCH, 256, 14, 14)),
        "c3x3_512_7": (lambda: cbr(512, 512, 3), (BATCH, 512, 7, 7)),
        "bottleneck_1024_14": (lambda: Residual(1024, 256), (BATCH, 1024, 14, 14)),
        "dw3x3_144_56": (lambda: cbr(144, 144, 3, groups=144), (BATCH, 144, 56, 56)),
        "dw7x7_96_56": (lambda: cbr(96, 96, 7, groups=96, relu=False), (BATCH, 96, 56, 56)),
    }


def _model(name: str) -> tuple[Any, tuple[int, ...]]:
    """A fresh fp32 CPU module (seeded: the builder and the timer get the same weights) and its input shape."""
    import torch

    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50().eval(), (BATCH, 3, 224, 224)
    make, (n, c, h, w) = _blocks()[name]
    m = _FromNHWC(make()).eval()
    for mod in m.modules():  # non-trivial batch-norm statistics, so the folded scales are exercised
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 1.5)
    return m, (n, h, w, c)


class _FromNHWC:
    """A block fed an [N, H, W, C] tensor (permuted to NCHW as a view): inside a network a block's input is
    the previous conv's channels-last buffer, and a package's own input is NCHW as the user passes it."""

    def __new__(cls, body: Any) -> Any:
        import torch

        class FromNHWC(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.body = body

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.body(x.permute(0, 3, 1, 2))

        return FromNHWC()


def _input(shape: tuple[int, ...]) -> Any:
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(*shape, generator=g)


# ---- step 1: build (subprocesses, GPU hidden) ----------------------------------------------------------


def build_one(name: str, precision: str, out: Path) -> None:
    import torch
    from aotc_build.build import build_captured, compile_graph
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target

    assert not torch.cuda.is_available(), "build with the GPU hidden: CUDA_VISIBLE_DEVICES="
    model, shape = _model(name)
    cap = capture_module(model, (_input(shape),), None, name=name, precision=precision)
    opts = BuildOptions(targets=(Target("cuda", "sm_90"),), precision=precision, selftest=False)
    build_captured(cap, out / f"{name}.{precision}.pkg", opts, out / "cache")
    _, prog, log = compile_graph(cap, channels_last=True)
    (out / f"{name}.{precision}.kernels.json").write_text(json.dumps({"kernels": _describe(prog), "fusion_log": log}))


def _describe(prog: Any) -> dict[str, dict[str, Any]]:
    """Kernel name -> what it is (and for a conv its shape and multiply-adds, for TFLOP/s)."""
    from aotc_build import kernel as K

    out: dict[str, dict[str, Any]] = {}
    for k in prog.kernels:
        row: dict[str, Any] = {"kind": type(k).__name__}
        if isinstance(k, K.Conv):
            oh, ow = (int(d) for d in k.out_hw)
            (kh, kw), cpg = k.kernel, k.c_in // k.groups
            macs = int(k.batch) * oh * ow * k.c_out * cpg * kh * kw
            row["what"] = (
                f"{kh}x{kw}/s{k.stride[0]} {k.c_in}->{k.c_out}" + (f" g{k.groups}" if k.groups > 1 else "")
                + f" @{int(k.height)}x{int(k.width)}"
            )  # fmt: skip
            row["flop"] = 2 * macs
        elif isinstance(k, K.Matmul):
            row["what"] = f"{k.m}x{k.k} @ {k.k}x{k.n}"
            row["flop"] = 2 * int(k.m) * int(k.n) * int(k.k)
        else:
            row["what"] = " x ".join(str(r) for r in k.ranges)
        out[k.name] = row
    return out


def build_all(out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    jobs = [(n, p) for n in names for p in PRECISIONS if not (out / f"{n}.{p}.kernels.json").exists()]
    # the two resnet50 builds are the long ones: start them first
    jobs.sort(key=lambda j: j[0] != "resnet50")

    def one(job: tuple[str, str]) -> str:
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "--build-one", job[0], job[1], "--dir", str(out)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if r.returncode:
            return f"build {job} FAILED:\n{r.stderr[-3000:]}"
        return f"built {job[0]} {job[1]} in {time.perf_counter() - t0:.1f} s"

    with concurrent.futures.ThreadPoolExecutor(max(1, min(8, (os.cpu_count() or 2) // 2))) as pool:
        for line in pool.map(one, jobs):
            print(line, flush=True)


# ---- step 2: time (this process) ---------------------------------------------------------------------


class _DLPack:
    """A torch tensor seen through DLPack only (bf16 has no ``__cuda_array_interface__``)."""

    def __init__(self, t: Any) -> None:
        self._t = t

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._t.__dlpack__(stream=stream)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()


def _time_kernels(ex: Any, calls: int = 50) -> dict[str, float]:
    """Each kernel of the last bound launch sequence alone: ``calls`` back-to-back launches, then a sync."""
    from aotc.cuda_launch import launch_all

    b = next(reversed(ex._bound.values()))  # the binding the last run() used; its slots hold its pointers
    out = {}
    for c in b.calls:
        def go(c: Any = c) -> None:
            launch_all(ex.drv, [c], ex.stream, False)

        def many(go: Any = go) -> None:
            for _ in range(calls):
                go()
            ex.synchronize()

        out[c.kernel] = median_ms(many, repeats=3, warmup=1, calls=1) / calls
    return out


def _compiled_ms(tm: Any, tx: Any) -> float | None:
    """torch.compile(mode="reduce-overhead") on the same module (about a minute to compile)."""
    import torch

    try:
        compiled = torch.compile(tm, mode="reduce-overhead")

        def call() -> None:
            with torch.no_grad():
                compiled(tx)
            torch.cuda.synchronize()

        return round(median_ms(call, repeats=5, warmup=5), 4)
    except Exception as e:  # a benchmark row, not a failure of the run
        print("torch.compile failed:", type(e).__name__, str(e)[:200], flush=True)
        return None


def time_all(out: Path, names: list[str], compile_too: bool = False) -> list[dict[str, Any]]:
    import aotc
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for name in names:
        for precision in PRECISIONS:
            pkg = out / f"{name}.{precision}.pkg"
            if not pkg.exists():
                print(f"{name} {precision}: no package (build failed?)", flush=True)
                continue
            dt = torch.bfloat16 if precision == "bf16" else torch.float32
            model, shape = _model(name)
            x = _input(shape)
            tm = model.to("cuda", dt).to(memory_format=torch.channels_last)
            tx = x.to("cuda", dt)  # blocks: [N, H, W, C], a channels_last view inside
            tx = tx.contiguous(memory_format=torch.channels_last) if name == "resnet50" else tx
            with torch.no_grad():
                want = tm(tx).float()

            def eager(tm: Any = tm, tx: Any = tx) -> None:
                with torch.no_grad():
                    tm(tx)
                torch.cuda.synchronize()

            torch_ms = median_ms(eager, repeats=5, warmup=5)
            compiled_ms = _compiled_ms(tm, tx) if compile_too and name == "resnet50" else None
            m = aotc.load(pkg, device="cuda")
            ex = m.executor
            dx = _DLPack(x.to("cuda", dt).contiguous())  # the package takes what the module takes (resnet50: NCHW)
            got = np.asarray(ex.run([dx], {})[0]).astype(np.float32)
            ref = want.cpu().numpy()
            err = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-6))
            graph_ms = median_ms(lambda ex=ex, dx=dx: ex.run([dx], {}, device_outputs=True, graph=True), repeats=5, warmup=5)
            plain_ms = median_ms(lambda ex=ex, dx=dx: ex.run([dx], {}, device_outputs=True, graph=False), repeats=3, warmup=3)
            per = _time_kernels(ex)
            info = json.loads((out / f"{name}.{precision}.kernels.json").read_text())["kernels"]
            kernels = []
            for kname, ms in per.items():
                d = info.get(kname, {})
                tflops = d["flop"] / (ms * 1e-3) / 1e12 if d.get("flop") else None
                kernels.append({"kernel": kname, "ms": round(ms, 4), **d, "tflops": tflops and round(tflops, 1)})
            row = {"model": name, "precision": precision, "torch_ms": round(torch_ms, 4), "torch_compiled_ms": compiled_ms,
                   "aotc_graph_ms": round(graph_ms, 4),
                   "aotc_plain_ms": round(plain_ms, 4), "ratio": round(graph_ms / torch_ms, 2), "max_rel_err": err,
                   "ok": err < (2e-2 if precision == "bf16" else 1e-3), "kernels": kernels}  # fmt: skip
            rows.append(row)
            if compiled_ms is not None:
                print(f"{name:20s} {precision:5s} torch.compile(reduce-overhead) {compiled_ms:8.3f} ms", flush=True)
            print(f"{name:20s} {precision:5s} torch {torch_ms:8.3f} ms  aotc {graph_ms:8.3f} ms (plain {plain_ms:.3f})"
                  f"  x{graph_ms / torch_ms:5.2f}  err {err:.1e}{'' if row['ok'] else '  MISMATCH'}", flush=True)  # fmt: skip
            slow = sorted(kernels, key=lambda r: -r["ms"])[: 12 if name == "resnet50" else 4]
            for r in slow:
                tf = f"{r['tflops']:6.1f} TFLOP/s" if r.get("tflops") else ""
                print(f"    {r['kernel']:18s} {r['ms'] * 1e3:8.1f} us  {r.get('what', ''):32s} {tf}", flush=True)
            m.close()
            del tm, tx
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="?")
    ap.add_argument("--dir", default=str(ROOT / ".aotc-cache" / "conv-gpu"))
    ap.add_argument("--only", default="")
    ap.add_argument("--no-resnet", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(reduce-overhead) on resnet50")
    ap.add_argument("--build-one", nargs=2, metavar=("NAME", "PRECISION"))
    a = ap.parse_args()
    out = Path(a.dir)
    if a.build_one:
        build_one(a.build_one[0], a.build_one[1], out)
        return
    names = [n for n in a.only.split(",") if n] or [*_blocks(), *([] if a.no_resnet else ["resnet50"])]
    t0 = time.perf_counter()
    build_all(out, names)
    print(f"built in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = time_all(out, names, a.compile)
    import torch
    from aotc import cuda

    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
           "device": cuda.device_info(), "batch": BATCH,
           "method": "median wall clock per call with a synchronize; torch eager: cudnn.benchmark, channels_last, TF32 off; "
                     "aotc: device-resident NCHW input, CUDA graph (plain: launches); kernels: each alone, 50 launches",
           "rows": rows}  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1, default=str))
    print(f"done in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
