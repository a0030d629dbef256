"""Attention on the CPU: one aotc package per case next to eager torch's SDPA, BERT-like shapes.

    python benchmarks/attention_cpu.py [OUT.json] [--threads N] [--cases plain,fused_causal_1,...]

Shapes: batch 4, 4 heads, 128 tokens, head dim 64, fp32 (the attention of the 4-layer BERT of DESIGN.md's
CPU table). Cases: no mask, a key-padding bool mask [B, 1, 1, S], causal, on separate q/k/v [B, H, L, E];
and as the transformers read them, heads of one fused QKV projection [B, L, 3 * H * E] split, viewed and
transposed, the output transposed back to [B, L, H * E]: BERT's shape with the key-padding mask
(fused_padded) and GPT-2 small's causal attention, 12 heads, at batch 1 and 4 (fused_causal_1/_4).
Each package is built for this machine's CPU and timed through ``Model.__call__`` with numpy inputs
(median of 7 rounds sized to ~0.3 s).
Run with another checkout's interpreter to time that tree's lowering on the same cases (before/after).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_timing import median_ms

B, H, L, E = 4, 4, 128, 64
# case: (batch, heads) of the fused-QKV cases
FUSED = {"fused_padded": (4, 4), "fused_causal_1": (1, 12), "fused_causal_4": (4, 12)}
CASES = ("plain", "padded", "causal", *FUSED)


def _module(case: str):  # type: ignore[no-untyped-def]
    import torch
    import torch.nn.functional as F

    causal = "causal" in case

    class Attn(torch.nn.Module):
        def forward(self, q, k, v, mask=None):  # type: ignore[no-untyped-def]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    class Fused(torch.nn.Module):
        def forward(self, qkv, mask=None):  # type: ignore[no-untyped-def]
            b, n, width = qkv.shape
            q, k, v = (t.view(b, n, width // (3 * E), E).transpose(1, 2) for t in qkv.split(width // 3, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
            return y.transpose(1, 2).reshape(b, n, width // 3)

    return (Fused() if case in FUSED else Attn()).eval()


def _inputs(case: str):  # type: ignore[no-untyped-def]
    import torch

    g = torch.Generator().manual_seed(0)
    b, h = FUSED.get(case, (B, H))
    xs = [torch.randn(b, L, 3 * h * E, generator=g)] if case in FUSED else [torch.randn(B, H, L, E, generator=g) for _ in range(3)]
    if "padded" in case:
        lengths = torch.tensor([L - 23 * j for j in range(b)])
        xs.append((torch.arange(L)[None, :] < lengths[:, None]).reshape(b, 1, 1, L))
    return xs


def main(json_path: Path | None, threads: int | None, cases: tuple[str, ...] = CASES) -> None:
    import aotc
    import torch
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target

    if threads:
        torch.set_num_threads(threads)
    cache = Path(os.environ.get("AOTC_CACHE_DIR", ".aotc-cache"))
    native = "x86-64-v4" if "avx512f" in Path("/proc/cpuinfo").read_text() else "x86-64-v3"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            xs = _inputs(case)
            mod = _module(case)
            cap = capture_module(mod, tuple(xs), None, name=f"attn_{case}")
            pkg = Path(tmp) / f"{case}.pkg"
            build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", native),), selftest=False), cache)
            m = aotc.load(pkg, device="cpu", num_threads=threads)
            arrays = [x.numpy() for x in xs]
            with torch.no_grad():
                want = mod(*xs).numpy()
            err = float(np.abs(m(*arrays) - want).max())
            t_aotc = median_ms(lambda m=m, arrays=arrays: m(*arrays), repeats=7, warmup=3)
            with torch.no_grad():
                t_torch = median_ms(lambda mod=mod, xs=xs: mod(*xs), repeats=7, warmup=3)
            row = {"case": case, "aotc_ms": round(t_aotc, 4), "torch_eager_ms": round(t_torch, 4), "max_abs_err": err}
            rows.append(row)
            print(json.dumps(row), flush=True)
            m.close()
    if json_path:
        doc = {"shape": [B, H, L, E], "cpu": platform.processor() or platform.machine(), "threads": threads or os.cpu_count(),
               "target": native, "torch": torch.__version__, "date": datetime.date.today().isoformat(), "rows": rows}  # fmt: skip
        json_path.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    args = sys.argv[1:]
    n = int(args[args.index("--threads") + 1]) if "--threads" in args else None
    paths = [a for a in args if a.endswith(".json")]
    chosen = tuple(args[args.index("--cases") + 1].split(",")) if "--cases" in args else CASES
    main(Path(paths[0]) if paths else None, n, chosen)
