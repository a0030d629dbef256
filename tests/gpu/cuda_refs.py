"""Eager torch on CUDA for every package in an artifact folder, on the GPU machine (TF32 off).

    python tests/gpu/cuda_refs.py ARTIFACT_DIR

make_artifacts.py computed references with eager torch on the build machine's CPU; this rebuilds each module
from its recipe and saved weights, runs the same inputs on the GPU, and writes <name>.cuda.npz
(``out.<k>.<j>``). test_packages_gpu.py then holds every package to both references. It runs in its own
process so that the runtime's tests never share one with torch. AOTC_REF_DEVICE=cpu checks the recipes on a
machine without a GPU: every difference must then be 0.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree

ROOT = Path(__file__).resolve().parents[2]
DEVICE = os.environ.get("AOTC_REF_DEVICE", "cuda")
sys.path.insert(0, str(ROOT / "tests"))


def _module(recipe: str) -> torch.nn.Module:
    kind, name = recipe.split(":", 1)
    if kind == "example":
        spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.model
    if kind == "op":
        from op_cases import CASES

        return next(c for c in CASES if c.name == name).make()
    from zoo.models import ZOO, FirstOutput, WithMask

    z = next(z for z in ZOO if z.name == name)
    return WithMask(z.make()) if kind == "zoo_masked" else FirstOutput(z.make())


def _tensor(a: np.ndarray, bf16: bool) -> torch.Tensor:
    if a.dtype.kind == "V":  # np.savez keeps ml_dtypes.bfloat16 as raw 2-byte voids
        return torch.from_numpy(a.view(np.uint16).astype(np.int32) << 16).view(torch.float32).to(torch.bfloat16)
    return torch.from_numpy(a)


def main(art: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    failed = []
    for ref_path in sorted(art.glob("*.ref.npz")):
        name = ref_path.name.removesuffix(".ref.npz")
        try:
            worst = _reference(art, name, np.load(ref_path))
        except Exception as e:  # one broken recipe must not hide the others; its package test then fails
            failed.append(name)
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
            continue
        print(f"{name}: eager {DEVICE} vs eager CPU {worst:.2e}", flush=True)
    if failed:
        sys.exit(f"no {DEVICE} reference for {len(failed)} packages: {' '.join(failed)}")


def _reference(art: Path, name: str, ref: np.lib.npyio.NpzFile) -> float:
    bf16 = name.endswith("_bf16")
    half = torch.bfloat16 if bf16 else torch.float16 if name.endswith("_fp16") else None
    model = _module(str(ref["recipe"])).eval()
    if half is not None:
        model = model.to(half)
    model.load_state_dict(torch.load(art / f"{name}.weights.pt", map_location="cpu"))
    model = model.to(DEVICE)
    outs, worst = {}, 0.0
    k = 0
    while f"out.{k}.0" in ref:
        xs = []
        i = 0
        while f"in.{k}.{i}" in ref:
            xs.append(_tensor(ref[f"in.{k}.{i}"], bf16).to(DEVICE))
            i += 1
        with torch.no_grad():
            ys = [t for t in pytree.tree_leaves(model(*xs)) if isinstance(t, torch.Tensor)]
        for j, t in enumerate(ys):
            y = t.float().cpu().numpy() if t.is_floating_point() else t.cpu().numpy()
            outs[f"out.{k}.{j}"] = y
            cpu = _tensor(ref[f"out.{k}.{j}"], bf16).float().numpy()
            if y.dtype.kind == "f":
                worst = max(worst, float(np.abs(y - cpu).max() / max(np.abs(cpu).max(), 1.0)))
        k += 1
    np.savez(art / f"{name}.cuda.npz", **outs)
    return worst


if __name__ == "__main__":
    main(Path(sys.argv[1]))
