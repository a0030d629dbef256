"""Tune the matmul/conv/attention kernels and big reductions of the benchmark models on this GPU, write the per-SM config table, and say
how far the table's and the heuristic's picks fall behind tuning, and how our matmuls compare with torch.mm.

    python benchmarks/tune_table.py OUT.json [--write-table] [--models mlp,gpt2,...] [--precisions bf16,fp16,fp32]

Kernels come from each model's kernel Program (capture + compile_graph at the benchmark's static shapes, no
cubins), collected in parallel processes; identical kernels are tuned once (aot/tune.py: candidates compiled
in parallel, timed with the runtime's launcher and CUDA events in a child process that a faulting candidate
cannot take the run down with). ``--write-table`` rewrites
aot/codegen/triton/tables/sm_NN.json with the winners. Designed to finish in a few minutes on a 16-core
H200 host; the cubin cache goes to $AOTC_CACHE_DIR (default: a folder beside OUT.json).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
MODELS = ("mlp", "gpt2", "bert", "vit", "resnet50", "llama", "mm4096", "attn", "ln8192")
PRECISIONS = ("bf16", "fp16", "fp32")


def _module(name: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "mlp":
        m = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 1024))
        return m, (torch.randn(64, 1024),)
    if name == "mm4096":

        class MM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.w = nn.Parameter(torch.randn(4096, 4096) * 0.02)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x @ self.w

        return MM(), (torch.randn(4096, 4096),)
    if name == "attn":  # the kernel figure of benchmarks/gpu_side_by_side.py: causal SDPA, 8x12x1024x64

        class Attn(nn.Module):
            def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        return Attn(), tuple(torch.randn(8, 12, 1024, 64) for _ in range(3))
    if name == "ln8192":
        return nn.LayerNorm(8192), (torch.randn(8192, 8192),)
    from zoo.models import REAL, real_inputs, real_module

    real = {"gpt2": ("gpt2_small", 1, 256), "bert": ("bert_base", 8, 128), "vit": ("vit_b_16", 8, 224),
            "resnet50": ("resnet50", 8, 224), "llama": ("llama_4l_1024", 4, 128)}[name]  # fmt: skip
    m = next(r for r in REAL if r.name == real[0])
    return real_module(m), real_inputs(m, real[1], real[2])


def collect(name: str, precision: str, sm: int, sms: int, device: str) -> tuple[str, str, list[Any] | str]:
    """(model, precision, the tunable kernels' jobs or why there are none): runs in a child process."""
    try:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # capture on the CPU, as a build does
        from aotc_build.build import compile_graph
        from aotc_build.capture import capture_module
        from aotc_build.codegen.triton import index_is_i64
        from aotc_build.codegen.triton.splitk import split_k
        from aotc_build.memory import plan_memory
        from aotc_build.options import BuildOptions, Target
        from aotc_build.tune import jobs

        model, inputs = _module(name)
        cap = capture_module(model, inputs, None, precision=precision, name=name)
        _, plan, _ = compile_graph(cap, channels_last=True)  # NHWC activations, as a CUDA target's build has them
        opts = BuildOptions(targets=(Target("cuda", f"sm_{sm}"),), precision=precision, selftest=False)
        split = split_k(plan, sm, opts)  # the kernels as the CUDA target builds them
        plan = plan_memory(split) if split is not plan else plan
        return name, precision, jobs(plan, sm, opts, index_is_i64(plan), sms, device)
    except Exception as e:  # a model that does not capture (or a precision not built yet) is reported, not fatal
        return name, precision, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _flop(s: Any) -> float:
    """Useful floating-point work of a tuned kernel (a reduction: its elements, so 'TFLOP/s' reads as Telem/s)."""
    if s.kind.startswith("attention"):
        return 4 * s.m * s.n * s.k * s.batch * (0.5 if s.kind == "attention_causal" else 1.0)
    if s.kind == "reduce":
        return s.m * s.n
    return 2 * s.m * s.n * s.k * s.batch


def torch_ms(shape: Any, precision: str) -> float | None:
    """torch.mm (or bmm) on the same M, N, K (conv shapes: None)."""
    if shape.kind != "matmul":
        return None
    import torch

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    b = shape.batch
    a = torch.randn(b, shape.m, shape.k, device="cuda", dtype=dt)
    w = torch.randn(b, shape.k, shape.n, device="cuda", dtype=dt)
    fn = (lambda: torch.mm(a[0], w[0])) if b == 1 else (lambda: torch.bmm(a, w))
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = math.inf
    for _ in range(3):
        start.record()
        for _ in range(20):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 20)
    return best


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "1") for a in sys.argv[1:] if a.startswith("--"))
    if len(args) != 1:
        sys.exit(__doc__)
    out = Path(args[0])
    names = opts.get("models", ",".join(MODELS)).split(",")
    precisions = opts.get("precisions", ",".join(PRECISIONS)).split(",")
    cache = Path(os.environ.get("AOTC_CACHE_DIR") or out.with_suffix(".cache"))
    t0 = time.perf_counter()

    from aotc_build.codegen.triton import configs
    from aotc_build.tune import compile_all, find_device, measure_isolated

    found = find_device(90 if "sm" not in opts else int(opts["sm"]))
    if isinstance(found, str):
        sys.exit(f"tune_table: {found}")
    drv, dev = found
    sm = dev.sm
    work = [(n, p) for n in names for p in precisions]
    with ProcessPoolExecutor(min(len(work), max(1, (os.cpu_count() or 2) // 2)), mp_context=get_context("spawn")) as pool:
        got = list(pool.map(collect, *zip(*work, strict=True), *[[x] * len(work) for x in (sm, dev.sm_count, dev.name)]))
    t_collect = time.perf_counter() - t0
    by_key: dict[str, Any] = {}
    uses: dict[str, list[str]] = {}
    errors = {}
    for name, precision, js in got:
        if isinstance(js, str):
            errors[f"{name}.{precision}"] = js
            print(f"skip {name} {precision}: {js}", flush=True)
            continue
        for j in js:
            by_key.setdefault(j.key, (j, precision))
            uses.setdefault(j.key, []).append(f"{name}.{precision}")
    todo = [j for j, _ in by_key.values()]
    print(f"{len(todo)} distinct kernels, {sum(len(j.candidates) for j in todo)} candidates; collected in {t_collect:.0f} s", flush=True)
    compiled = compile_all(todo, sm, cache, True)
    t_compile = time.perf_counter() - t0 - t_collect
    print(f"compiled in {t_compile:.0f} s", flush=True)

    rows: list[dict[str, Any]] = []
    best_cfg: dict[int, Any] = {}
    table = configs.table(sm)
    order = sorted(by_key, key=lambda k: (by_key[k][0].shape.key, k))
    results = measure_isolated([by_key[k][0] for k in order], compiled, sm, lambda line: print(line, flush=True))
    for key in order:
        j, precision = by_key[key]
        r = results.get(key)
        if r is None:
            print(f"no candidate ran for {j.shape.key}", flush=True)
            continue
        ms = dict(r.timings)
        heur = configs.heuristic(j.shape, sm, dev.sm_count)
        tab = table.get(j.shape.key)
        flop = _flop(j.shape)
        row = {"key": key, "shape": j.shape.key, "precision": precision, "models": sorted(set(uses[key])), "kernels": len(j.names),
               "best": str(r.config), "best_ms": r.ms, "heuristic": str(heur), "heuristic_ms": ms.get(str(heur)),
               "table": str(tab) if tab else None, "table_ms": ms.get(str(tab)) if tab else None,
               "tflops": round(flop / r.ms / 1e9, 1), "timings": r.timings}  # fmt: skip
        rows.append(row)
        best_cfg[id(row)] = r.config
    for row in rows:
        j, precision = by_key[row["key"]]
        t = torch_ms(j.shape, precision)
        if t is not None:
            row["torch_ms"] = round(t, 5)
            row["vs_torch"] = round(t / row["best_ms"], 3)
    t_bench = time.perf_counter() - t0 - t_collect - t_compile

    print(f"\n{'shape':44} {'prec':5} {'best':22} {'ms':>8} {'heur/best':>9} {'table/best':>10} {'TFLOP/s':>8} {'torch/ours':>10}")
    for row in rows:
        hr = row["heuristic_ms"] / row["best_ms"] if row["heuristic_ms"] else float("nan")
        tr = row["table_ms"] / row["best_ms"] if row["table_ms"] else float("nan")
        print(f"{row['shape']:44} {row['precision']:5} {row['best']:22} {row['best_ms']:8.4f} {hr:9.2f} {tr:10.2f} "
              f"{row['tflops']:8.1f} {row.get('vs_torch', float('nan')):10.2f}")  # fmt: skip
    gaps = [r["heuristic_ms"] / r["best_ms"] for r in rows if r["heuristic_ms"]]
    total_best = sum(r["best_ms"] * r["kernels"] for r in rows)
    total_heur = sum((r["heuristic_ms"] or r["best_ms"]) * r["kernels"] for r in rows)
    print(
        f"\nheuristic vs tuned: geomean {math.exp(sum(map(math.log, gaps)) / max(1, len(gaps))):.3f}x, "
        f"worst {max(gaps, default=float('nan')):.2f}x; summed kernel time {total_heur:.3f} vs {total_best:.3f} ms"
    )
    for row in rows:
        if row["models"] and all(m.startswith("mm4096.") for m in row["models"]):
            vs = row.get("vs_torch", float("nan"))
            print(f"4096^3 {row['precision']}: {row['tflops']} TFLOP/s ({row['best']}), {vs:.2f}x torch.mm's speed")
    print(f"times: collect {t_collect:.0f} s, compile {t_compile:.0f} s, bench {t_bench:.0f} s")

    entries = {}
    for row in sorted(rows, key=lambda r: (r["shape"], -r["kernels"])):  # the shape's most used kernel wins
        if row["shape"] not in entries:
            entries[row["shape"]] = {"config": best_cfg[id(row)].to_json(), "ms": row["best_ms"], "models": row["models"]}
    doc = {"sm": sm, "sm_count": dev.sm_count, "device": dev.name, "date": datetime.date.today().isoformat(),
           "note": "written by benchmarks/tune_table.py --write-table; keys are configs.Shape.key", "entries": entries}  # fmt: skip
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": dev.name, "sm": sm,
              "sm_count": dev.sm_count, "python": platform.python_version(), "versions": _versions(),
              "seconds": {"collect": t_collect, "compile": t_compile, "bench": t_bench}, "errors": errors,
              "rows": rows, "table": doc}  # fmt: skip
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    if "write-table" in opts:
        path = ROOT / "aot" / "codegen" / "triton" / "tables" / f"sm_{sm}.json"
        old = json.loads(path.read_text()).get("entries", {}) if path.is_file() else {}
        doc["entries"] = {**old, **entries}  # runs over a few models or precisions at a time add up
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")


def _versions() -> dict[str, str]:
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__}


if __name__ == "__main__":
    main()
