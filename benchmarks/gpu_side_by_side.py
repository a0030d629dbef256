"""aotc packages against every torch mode, side by side in one process on one GPU.

    CUDA_VISIBLE_DEVICES= python benchmarks/gpu_side_by_side.py build DIR [--precisions bf16,fp16] [--models a,b] [--tune]
    python benchmarks/gpu_side_by_side.py warm DIR [--precisions ...] [--models ...] [--modes ...] [--jobs N]
    python benchmarks/gpu_side_by_side.py run DIR OUT.json [--precisions ...] [--models ...] [--modes ...]

``build`` makes each model's weights once (seeded, saved beside the packages so torch runs the same ones), then
builds one package per model and precision in parallel processes with the GPU hidden from the builder (as on a
build machine), recording build times. ``run`` loads each package with the runtime and times it next to eager
torch and each torch.compile mode on the same weights and inputs: wall clock per call including the device
sync, the median of ``--calls`` calls per round, the best of ``--rounds`` interleaved rounds. It also records
each package's error against eager, its per-kernel GPU times, the host time a call costs above its GPU time,
and kernel-level figures (matmul TFLOP/s against torch.mm, causal attention against torch's SDPA, layer-norm
GB/s against a device-to-device copy). Prints a table; writes JSON with device, versions and date.

A torch mode whose compile would not fit the time left (``--budget-s``) is skipped and the skip is recorded
with the compile times measured so far. TF32 is off everywhere.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


@dataclass(frozen=True)
class Spec:
    name: str
    text: bool  # token ids in (batch, seq), else images or features
    shape: tuple[int, ...]  # the benchmarked input shape
    kernel: bool = False  # a single-op package for kernel-level figures (static shapes)


MODELS = [
    Spec("mlp", False, (64, 1024)),
    Spec("gpt2", True, (1, 256)),
    Spec("bert", True, (8, 128)),
    Spec("vit_b_16", False, (8, 3, 224, 224)),
    Spec("resnet50", False, (8, 3, 224, 224)),
    Spec("llama", True, (4, 128)),
    Spec("tiny", False, (1, 64)),  # host overhead: one small linear layer
]
KERNELS = [
    Spec("k_mm", False, (4096, 4096), kernel=True),
    Spec("k_attention", False, (8, 12, 1024, 64), kernel=True),
    Spec("k_layernorm", False, (8192, 8192), kernel=True),
]
SPECS = {s.name: s for s in (*MODELS, *KERNELS)}


# ---- models (torch side; imported lazily so `--help` needs nothing) ----------------------------------------


def make_module(spec: Spec) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    if spec.name == "mlp":
        return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 1024))
    if spec.name == "tiny":
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    if spec.name == "k_mm":

        class MM(nn.Module):
            def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
                return a @ b

        return MM()
    if spec.name == "k_attention":

        class Attn(nn.Module):
            def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return Attn()
    if spec.name == "k_layernorm":
        return nn.LayerNorm(spec.shape[-1])
    from zoo.models import REAL, real_module

    zoo = {"gpt2": "gpt2_small", "bert": "bert_base", "llama": "llama_4l_1024"}.get(spec.name, spec.name)
    return real_module(next(m for m in REAL if m.name == zoo))


def make_inputs(spec: Spec, seed: int = 1, capture: bool = False) -> tuple[Any, ...]:
    """The benchmark's inputs; for capture, a batch of at least 2 (torch.export specializes a dynamic 1)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    shape = (max(2, spec.shape[0]), *spec.shape[1:]) if capture and not spec.kernel else spec.shape
    if spec.text:
        return (torch.randint(0, 1000, shape, generator=g),)
    if spec.name == "k_mm":
        return tuple(torch.randn(spec.shape, generator=g) for _ in range(2))
    if spec.name == "k_attention":
        return tuple(torch.randn(spec.shape, generator=g) for _ in range(3))
    return (torch.randn(shape, generator=g),)


def dynamic(spec: Spec) -> Any:
    import torch

    if spec.kernel:
        return None
    dims = {0: torch.export.Dim("batch", min=1, max=64)}
    if spec.text:
        dims[1] = torch.export.Dim("seq", min=2, max=512)  # BERT has 512 positions
    return (dims,)


# ---- build ------------------------------------------------------------------------------------------------


def build(out: Path, specs: list[Spec], precisions: list[str], tune: bool, jobs: int) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    for s in specs:
        w = out / f"{s.name}.weights.pt"
        if not w.exists() and not s.kernel:
            torch.manual_seed(0)
            torch.save(make_module(s).state_dict(), w)
    todo = [(s, p) for s in specs for p in precisions if not (s.kernel and p == "fp32")]
    # the GPU hidden, as on a build machine without one; --tune needs it to time candidates
    env = dict(os.environ) if tune else dict(os.environ, CUDA_VISIBLE_DEVICES="")

    def one(item: tuple[Spec, str]) -> tuple[str, str, float, int, str]:
        s, p = item
        cmd = [sys.executable, __file__, "build-one", str(out), s.name, p] + (["--tune"] if tune else [])
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        return s.name, p, time.perf_counter() - t0, r.returncode, (r.stdout + r.stderr)[-2000:]

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for name, p, secs, rc, log in pool.map(one, todo):
            print(f"built {name} {p} in {secs:.1f} s" + ("" if rc == 0 else f" FAILED rc={rc}\n{log}"), flush=True)
    print(f"all builds: {time.perf_counter() - t0:.1f} s wall with {jobs} parallel builders", flush=True)


def build_one(out: Path, spec: Spec, precision: str, tune: bool) -> None:
    import torch
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target

    assert tune or not torch.cuda.is_available(), "build with the GPU hidden: CUDA_VISIBLE_DEVICES="
    t0 = time.perf_counter()
    model = make_module(spec).eval()
    if not spec.kernel:
        model.load_state_dict(torch.load(out / f"{spec.name}.weights.pt"))
    cap = capture_module(model, make_inputs(spec, capture=True), dynamic(spec), name=spec.name, precision=precision)
    kw: dict[str, Any] = {"tune": True} if tune else {}
    opts = BuildOptions(targets=(Target("cuda", "sm_90"),), precision=precision, selftest=False, **kw)
    report = build_captured(cap, out / f"{spec.name}.{precision}.pkg", opts, out / "cache")
    secs = time.perf_counter() - t0
    meta = {"build_s": round(secs, 2), "kernels": report.kernels, "stages_s": report.seconds if report else {}}
    (out / f"{spec.name}.{precision}.build.json").write_text(json.dumps(meta, default=str))


# ---- run --------------------------------------------------------------------------------------------------


def timed_median(fn: Callable[[], object], calls: int) -> float:
    """Median ms over ``calls`` individually timed calls (each ends with its own device sync)."""
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def torch_dtype(precision: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def host_arrays(xs: tuple[Any, ...], precision: str) -> list[np.ndarray]:
    import ml_dtypes

    out = []
    for x in xs:
        a = x.numpy()
        if x.is_floating_point() and precision == "bf16":
            a = a.astype(ml_dtypes.bfloat16)
        elif x.is_floating_point() and precision == "fp16":
            a = a.astype(np.float16)
        out.append(a)
    return out


class Aotc:
    """One package on the GPU with device-resident inputs and preallocated outputs (no per-call allocation)."""

    def __init__(self, path: Path, host: list[np.ndarray]) -> None:
        import aotc

        t0 = time.perf_counter()
        self.model = aotc.load(path, device="cuda")
        self.load_ms = (time.perf_counter() - t0) * 1e3
        self.ex = ex = self.model.executor
        self.env = self.model.bind([x.shape for x in host])
        self.xs = [ex.to_device(x) for x in host]
        shapes = self.model.output_shapes(self.env)
        self.outs = [ex.empty(s, t.dtype) for s, t in zip(shapes, self.model.manifest.outputs, strict=True)]
        self.kernels = len(ex.cuda.kernels)

    def call(self, graph: bool) -> Callable[[], object]:
        ex, xs, env, outs = self.ex, self.xs, self.env, self.outs
        return lambda: ex.run(xs, env, outputs=outs, graph=graph)

    def output(self) -> np.ndarray:
        self.call(True)()
        return self.ex.to_host(self.outs[0]).astype(np.float32)

    def profile(self) -> list[tuple[str, float]]:
        return self.ex.profile(self.xs, self.env, repeats=10)


def compare(got: np.ndarray, want: np.ndarray) -> float:
    scale = max(float(np.abs(want).max()), 1e-6)
    return float(np.abs(got - want).max() / scale)


def torch_call(fn: Callable[..., Any], xs: tuple[Any, ...]) -> Callable[[], object]:
    import torch

    def call() -> None:
        with torch.no_grad():
            fn(*xs)
        torch.cuda.synchronize()

    return call


def compiled(model: Any, mode: str, xs: tuple[Any, ...]) -> Callable[[], object]:
    """``model`` under torch.compile in ``mode``, compiled, warmed up and (CUDA-graph modes) recorded."""
    import copy

    import torch

    call = torch_call(torch.compile(copy.deepcopy(model), mode=None if mode == "default" else mode), xs)
    for _ in range(3):  # compile, then CUDA-graph warm-up and recording
        call()
    return call


def load_model(spec: Spec, precision: str, d: Path) -> tuple[Any, tuple[Any, ...], tuple[Any, ...]]:
    """The benchmarked module on the GPU in ``precision`` with its seeded weights, its inputs on the host and
    on the GPU."""
    import torch

    dt = torch_dtype(precision)
    model = make_module(spec).eval()
    if not spec.kernel:
        model.load_state_dict(torch.load(d / f"{spec.name}.weights.pt"))
    model = model.to("cuda", dt)
    xs_cpu = make_inputs(spec, seed=1)
    xs = tuple((x.to(dt) if x.is_floating_point() else x).cuda() for x in xs_cpu)
    return model, xs_cpu, xs


def warm(d: Path, specs: list[Spec], precisions: list[str], modes: list[str], jobs: int) -> None:
    """Fill torch's compile caches (FX graph cache, autotuning results) for every model, precision and compiled
    mode in ``jobs`` parallel processes, so that ``run`` compiles from the cache in one process. max-autotune
    takes minutes a model, longer than a device call leaves; the modes' code is unchanged by where it was
    compiled, though autotuning side by side on one GPU may time candidates less cleanly."""
    todo = [(s, p, m) for p in precisions for s in specs if not s.kernel for m in modes if m != "eager"]

    def one(item: tuple[Spec, str, str]) -> str:
        s, p, m = item
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "warm-one", str(d), s.name, p, m], capture_output=True,
                           text=True, check=False)  # fmt: skip
        tail = "" if r.returncode == 0 else f" FAILED rc={r.returncode}: {(r.stdout + r.stderr)[-600:]}"
        return f"warmed {s.name} {p} {m} in {time.perf_counter() - t0:.1f} s{tail}"

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(one, sorted(todo, key=lambda t: not t[2].startswith("max-autotune"))):
            print(line, flush=True)
    print(f"warm: {time.perf_counter() - t0:.1f} s wall with {jobs} processes", flush=True)


def run_model(spec: Spec, precision: str, d: Path, modes: list[str], args: argparse.Namespace, deadline: float, later: int) -> dict:
    """One model in one precision; ``later`` models still follow, each owed a minute of the budget for its
    reduce-overhead compile before any max-autotune compile may start."""
    import torch

    row: dict[str, Any] = {"model": spec.name, "precision": precision, "shape": list(spec.shape)}
    pkg = d / f"{spec.name}.{precision}.pkg"
    meta = d / f"{spec.name}.{precision}.build.json"
    if meta.exists():
        row["aotc_build"] = json.loads(meta.read_text())
    model, xs_cpu, xs = load_model(spec, precision, d)
    with torch.no_grad():
        want = model(*xs)
    want_np = (want[0] if isinstance(want, tuple) else want).float().cpu().numpy()
    contenders: dict[str, Callable[[], object]] = {}
    compile_s: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for mode in modes:
        if mode == "eager":
            contenders["eager"] = torch_call(model, xs)
            continue
        left = deadline - time.time()
        slow = mode.startswith("max-autotune")
        guess = 2.5 * max(compile_s.values(), default=30.0) if slow else 60.0
        kept = 60.0 * later if slow else 0.0
        if left < guess + kept:
            skipped[mode] = (f"skipped: {left:.0f} s left of the run's budget, compile estimated {guess:.0f} s, "
                             f"{kept:.0f} s kept for {later} later models")  # fmt: skip
            continue
        try:
            t0 = time.perf_counter()
            contenders[mode] = compiled(model, mode, xs)
            compile_s[mode] = round(time.perf_counter() - t0, 1)
        except Exception as e:  # a mode that fails on this model is reported, not fatal
            skipped[mode] = f"failed: {type(e).__name__}: {e}"[:300]
    if pkg.exists():
        a = Aotc(pkg, host_arrays(xs_cpu, precision))
        row["aotc_load_ms"] = round(a.load_ms, 2)
        row["aotc_kernels"] = a.kernels
        row["aotc_max_rel_err"] = compare(a.output(), want_np)
        contenders["aotc_graph"] = a.call(True)
        contenders["aotc_plain"] = a.call(False)
    else:
        row["aotc_missing"] = str(pkg)
    for fn in contenders.values():  # warm-up
        for _ in range(5):
            fn()
    rounds: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for k, fn in contenders.items():
            rounds[k].append(timed_median(fn, args.calls))
    row["ms"] = {k: round(min(v), 4) for k, v in rounds.items()}
    row["rounds_ms"] = {k: [round(x, 4) for x in v] for k, v in rounds.items()}
    row["torch_compile_s"] = compile_s
    row["skipped"] = skipped
    torch_ms = {k: v for k, v in row["ms"].items() if not k.startswith("aotc")}
    if torch_ms and pkg.exists():
        best = min(torch_ms, key=torch_ms.__getitem__)
        aotc_ms = min(row["ms"]["aotc_graph"], row["ms"]["aotc_plain"])
        row["best_torch"] = best
        row["speedup_vs_best_torch"] = round(torch_ms[best] / aotc_ms, 3)
        prof = a.profile()
        gpu_ms = sum(t for _, t in prof)
        row["aotc_gpu_ms"] = round(gpu_ms, 4)
        row["aotc_host_over_gpu_us"] = round((row["ms"]["aotc_graph"] - gpu_ms) * 1e3, 1)
        by: dict[str, float] = {}
        for k, t in prof:
            by[k] = by.get(k, 0.0) + t
        row["aotc_top_kernels_ms"] = sorted(((k, round(t, 4)) for k, t in by.items()), key=lambda kt: -kt[1])[:12]
        a.model.close()
    del contenders
    torch.cuda.empty_cache()
    return row


def kernel_figures(d: Path, precision: str) -> dict:
    """Kernel-level rates: GPU time by CUDA events (torch over back-to-back launches, aotc around its kernels)."""
    import torch
    import torch.nn.functional as F

    dt = torch_dtype(precision)

    def events_ms(fn: Callable[[], object], n: int = 50) -> float:
        fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = math.inf
        for _ in range(3):
            s.record()
            for _ in range(n):
                fn()
            e.record()
            e.synchronize()
            best = min(best, s.elapsed_time(e) / n)
        return best

    def aotc_ms(name: str, xs: tuple[Any, ...]) -> float | None:
        pkg = d / f"{name}.{precision}.pkg"
        if not pkg.exists():
            return None
        a = Aotc(pkg, host_arrays(xs, precision))
        # GPU time by events around each kernel: back-to-back run() calls would time the executor's host path
        # (each call ends in a sync), not the kernels
        best = min(sum(t for _, t in a.profile()) for _ in range(3))
        a.model.close()
        return best

    out: dict[str, Any] = {"precision": precision}
    xs = make_inputs(SPECS["k_mm"])
    a, b = (x.to("cuda", dt) for x in xs)
    flop = 2 * 4096**3
    t_torch = events_ms(lambda: torch.mm(a, b))
    t_aotc = aotc_ms("k_mm", xs)
    out["matmul_4096"] = {"torch_mm_tflops": round(flop / t_torch / 1e9, 1),
                          "aotc_tflops": round(flop / t_aotc / 1e9, 1) if t_aotc else None,
                          "aotc_vs_torch": round(t_torch / t_aotc, 3) if t_aotc else None}  # fmt: skip
    xs = make_inputs(SPECS["k_attention"])
    q, k, v = (x.to("cuda", dt) for x in xs)
    t_torch = events_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    t_aotc = aotc_ms("k_attention", xs)
    out["attention_causal_8x12x1024x64"] = {"torch_sdpa_ms": round(t_torch, 4), "aotc_ms": t_aotc and round(t_aotc, 4),
                                            "aotc_vs_torch": round(t_torch / t_aotc, 3) if t_aotc else None}  # fmt: skip
    (x,) = make_inputs(SPECS["k_layernorm"])
    xd = x.to("cuda", dt)
    ln = torch.nn.LayerNorm(8192).to("cuda", dt)
    nbytes = 2 * xd.numel() * xd.element_size()
    dst = torch.empty_like(xd)
    t_copy = events_ms(lambda: dst.copy_(xd))
    with torch.no_grad():
        t_torch = events_ms(lambda: ln(xd))
    t_aotc = aotc_ms("k_layernorm", (x,))
    out["layernorm_8192"] = {"copy_gbs": round(nbytes / t_copy / 1e6, 1), "torch_gbs": round(nbytes / t_torch / 1e6, 1),
                             "aotc_gbs": round(nbytes / t_aotc / 1e6, 1) if t_aotc else None,
                             "aotc_vs_copy": round(t_copy / t_aotc, 3) if t_aotc else None}  # fmt: skip
    return out


def run(d: Path, out_json: Path, specs: list[Spec], precisions: list[str], modes: list[str], args: argparse.Namespace) -> None:
    import torch
    import triton

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = 64
    deadline = time.time() + args.budget_s
    from aotc import cuda

    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": cuda.device_info(), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "commit": _commit(),
        "method": f"wall clock per call incl. device sync; median of {args.calls} calls per round, best of "
                  f"{args.rounds} interleaved rounds; device-resident inputs, aotc outputs preallocated; TF32 off; "
                  "speedup = best torch mode / best aotc (graph or plain); kernel figures by CUDA events",
        "rows": [], "kernels": [],
    }  # fmt: skip
    for p in precisions:  # first: quick, and a late timeout must not lose them
        if any(s.kernel for s in specs) and p != "fp32":
            figs = kernel_figures(d, p)
            doc["kernels"].append(figs)
            print(json.dumps(figs), flush=True)
    todo = [(p, s) for p in precisions for s in specs if not s.kernel]
    for i, (p, s) in enumerate(todo):
        row = run_model(s, p, d, modes, args, deadline, len(todo) - i - 1)
        doc["rows"].append(row)
        _print_row(row)
        out_json.write_text(json.dumps(doc, indent=1, default=str))
    for p in precisions:
        ratios = [r["speedup_vs_best_torch"] for r in doc["rows"] if r["precision"] == p and "speedup_vs_best_torch" in r
                  and r["model"] != "tiny"]  # fmt: skip
        if ratios:
            doc.setdefault("geomean_speedup", {})[p] = round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)
    print("geomean speedup vs best torch mode:", doc.get("geomean_speedup"), flush=True)
    out_json.write_text(json.dumps(doc, indent=1, default=str))


def _print_row(row: dict) -> None:
    ms = row.get("ms", {})
    cells = "  ".join(f"{k} {v:.3f}" for k, v in ms.items())
    print(
        f"{row['model']:10s} {row['precision']:5s} {cells}  speedup {row.get('speedup_vs_best_torch')}"
        f"  err {row.get('aotc_max_rel_err', float('nan')):.2e}  host {row.get('aotc_host_over_gpu_us')} us",
        flush=True,
    )


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=("build", "build-one", "warm", "warm-one", "run"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("rest", nargs="*")
    ap.add_argument("--models", default=",".join(s.name for s in (*MODELS, *KERNELS)))
    ap.add_argument("--precisions", default="bf16")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip torch modes whose compile would not fit")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--tune", action="store_true")
    args = ap.parse_args()
    specs = [SPECS[n] for n in args.models.split(",") if n]
    precisions = [p for p in args.precisions.split(",") if p]
    if args.cmd == "build":
        build(args.dir, specs, precisions, args.tune, args.jobs)
    elif args.cmd == "build-one":
        build_one(args.dir, SPECS[args.rest[0]], args.rest[1], args.tune)
    elif args.cmd == "warm":
        warm(args.dir, specs, precisions, [m for m in args.modes.split(",") if m], args.jobs)
    elif args.cmd == "warm-one":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        model, _, xs = load_model(SPECS[args.rest[0]], args.rest[1], args.dir)
        compiled(model, args.rest[2], xs)
    else:
        run(args.dir, Path(args.rest[0]), specs, precisions, [m for m in args.modes.split(",") if m], args)


if __name__ == "__main__":
    main()
