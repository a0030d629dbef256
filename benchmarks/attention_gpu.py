"""Fused attention on the GPU next to torch's SDPA, in one process, on the same device tensors.

    python benchmarks/attention_gpu.py OUT.json [--dir DIR]

Builds one package per case in a child process with the GPU hidden (CUDA_VISIBLE_DEVICES=, cross-compiled
for sm_90, no autotuning: what a build machine does), then in this process loads each on the GPU, checks
it against F.scaled_dot_product_attention on the same bf16 inputs and times both: wall clock per call
including the device sync, median of REPEATS rounds of CALLS calls after warm-up. aotc runs
``executor.run(device inputs, device_outputs=True, graph=True)`` (one CUDA-graph replay and a sync);
torch runs the SDPA call and ``torch.cuda.synchronize()``. Prints a table and writes JSON.

Cases (bf16, batch 8, 12 heads, 1024 tokens, head dim 64):
  causal        sdpa(q, k, v, is_causal=True)
  padded        sdpa(q, k, v, attn_mask=key_padding[B, 1, 1, S]) (bool; each sequence a different length)
  causal_merge  causal, then attn.transpose(1, 2).reshape(B, L, H * E) as transformers do: aotc folds it into
                the kernel's store; torch's row includes the copy
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_timing import median_ms

B, H, L, E = 8, 12, 1024, 64
WARMUP, CALLS, REPEATS = 10, 50, 7
CASES = ("causal", "padded", "causal_merge")


def _module(case: str) -> Any:
    import torch
    import torch.nn.functional as F

    class Attn(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            if case == "padded":
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if case == "causal_merge":
                return o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)
            return o

    return Attn()


def _inputs(case: str, device: str) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(B, H, L, E, generator=g) for _ in range(3)]
    if case == "padded":
        lengths = torch.tensor([L - 97 * j for j in range(B)])
        xs.append((torch.arange(L)[None, :] < lengths[:, None]).reshape(B, 1, 1, L))
    return [x.to(device, torch.bfloat16) if x.is_floating_point() else x.to(device) for x in xs]


class DLPackOnly:
    """A torch tensor seen through DLPack alone: torch's __cuda_array_interface__ refuses bf16."""

    def __init__(self, t: Any) -> None:
        self.t = t

    def __dlpack__(self, *args: Any, **kw: Any) -> Any:
        return self.t.__dlpack__(*args, **kw)

    def __dlpack_device__(self) -> Any:
        return self.t.__dlpack_device__()


def build(out: Path) -> None:
    import torch
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target

    assert not torch.cuda.is_available(), "build with the GPU hidden: CUDA_VISIBLE_DEVICES="
    out.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        cap = capture_module(_module(case), tuple(_inputs(case, "cpu")), None, name=f"attn_{case}", precision="bf16")
        opts = BuildOptions(targets=(Target("cuda", "sm_90"),), precision="bf16", selftest=False)
        build_captured(cap, out / f"{case}.pkg", opts, out / "cache")
        print(f"built {case}", flush=True)


def run(out: Path, json_path: Path) -> None:
    import aotc
    import torch
    from aotc import cuda

    rows = []
    for case in CASES:
        model = aotc.load(out / f"{case}.pkg", device="cuda")
        ex = model.executor
        xs = _inputs(case, "cuda")
        env = model.bind([tuple(x.shape) for x in xs])
        dxs = [DLPackOnly(x) if x.is_floating_point() else x for x in xs]
        ref_mod = _module(case)
        with torch.no_grad():
            want = ref_mod(*xs).float()
        (got,) = ex.run(dxs, env, device_outputs=True, graph=True)
        got_t = torch.from_numpy(np.asarray(ex.to_host(got), dtype=np.float32)).cuda()
        err = float((got_t - want).abs().max() / want.abs().max().clamp_min(1e-6))

        def aotc_call(ex: Any = ex, dxs: list = dxs, env: dict = env) -> None:
            ex.run(dxs, env, device_outputs=True, graph=True)  # returns after the stream sync

        def torch_call(xs: list = xs, ref_mod: Any = ref_mod) -> None:
            with torch.no_grad():
                ref_mod(*xs)
            torch.cuda.synchronize()

        t_aotc = min(median_ms(aotc_call, repeats=REPEATS, calls=CALLS, warmup=WARMUP) for _ in range(3))
        t_torch = min(median_ms(torch_call, repeats=REPEATS, calls=CALLS, warmup=WARMUP) for _ in range(3))
        flops = 4 * B * H * L * L * E * (0.5 if case != "padded" else 1.0)
        row = {"case": case, "aotc_ms": round(t_aotc, 4), "torch_sdpa_ms": round(t_torch, 4),
               "aotc_over_torch": round(t_torch / t_aotc, 3), "aotc_tflops": round(flops / t_aotc / 1e9, 1),
               "max_rel_err": err, "ok": err < 2e-2,
               "kernels": [k.name for k in ex.cuda.kernels] if hasattr(ex, "cuda") else None}  # fmt: skip
        rows.append(row)
        model.close()
    print(f"{'case':14s} {'aotc ms':>9s} {'torch ms':>9s} {'torch/aotc':>10s} {'TFLOP/s':>8s} {'rel err':>9s}")
    for r in rows:
        print(f"{r['case']:14s} {r['aotc_ms']:9.4f} {r['torch_sdpa_ms']:9.4f} {r['aotc_over_torch']:10.3f} "
              f"{r['aotc_tflops']:8.1f} {r['max_rel_err']:9.2e}{'' if r['ok'] else '  WRONG'}")  # fmt: skip
    import triton

    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__, "triton_build": triton.__version__,
           "device": cuda.device_info(), "shape": {"batch": B, "heads": H, "length": L, "head_dim": E, "dtype": "bf16"},
           "method": f"wall clock per call with sync, median of {REPEATS}x{CALLS} calls after {WARMUP} warm-ups, best "
                     "of 3 rounds; the same device tensors for both; aotc with CUDA-graph replay", "rows": rows}  # fmt: skip
    json_path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {json_path}")


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--build":
        build(Path(args[1]))
        return
    json_path = Path(args[0])
    out = Path(args[args.index("--dir") + 1]) if "--dir" in args else Path(".aotc-cache/attention-bench")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run([sys.executable, __file__, "--build", str(out)], check=True, env=env)
    run(out, json_path)


if __name__ == "__main__":
    main()
