"""Build GPU packages on this (GPU-less) machine for the device run, with eager references.

    python tests/gpu/make_artifacts.py OUT_DIR [--quick]

Writes OUT_DIR/<name>.pkg (cuda:sm_90 only) and OUT_DIR/<name>.ref.npz (inputs ``in.<k>.<i>`` and every
eager output ``out.<k>.<j>`` for case k) for the examples, the op table and the zoo, each in fp32 and bf16.
tests/gpu/test_packages_gpu.py runs them on the GPU with nothing but numpy + cffi + libcuda.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from aotc_build.build import build_captured  # noqa: E402
from aotc_build.capture import capture_module  # noqa: E402
from aotc_build.options import BuildOptions, Target  # noqa: E402
from op_cases import CASES, dynamic_shapes, precisions  # noqa: E402
from zoo.models import ZOO, FirstOutput, WithMask, padded_dynamic_shapes, padded_inputs  # noqa: E402
from zoo.models import dynamic_shapes as zoo_dynamic  # noqa: E402
from zoo.models import inputs as zoo_inputs  # noqa: E402

SM90 = (Target("cuda", "sm_90"),)


def _np(t: torch.Tensor) -> np.ndarray:
    import ml_dtypes

    t = t.detach().contiguous()
    return t.float().numpy().astype(ml_dtypes.bfloat16) if t.dtype is torch.bfloat16 else t.numpy()


def emit(
    out: Path,
    name: str,
    model: torch.nn.Module,
    example: tuple,
    dyn,
    cases: list[tuple],
    recipe: str,
    precision: str = "fp32",
) -> None:
    cap = capture_module(model, example, dyn, name=name, precision=precision)
    build_captured(
        cap, out / f"{name}.pkg", BuildOptions(targets=SM90, precision=precision), ROOT / ".aotc-cache"
    )
    ref: dict[str, np.ndarray] = {}
    m = cap.model
    for k, case_inputs in enumerate(cases):
        xs = case_inputs
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if half is not None:  # the captured model's weights are in that precision
            xs = tuple(x.to(half) if x.is_floating_point() else x for x in xs)
        with torch.no_grad():
            y = m(*xs)
        for i, x in enumerate(xs):
            ref[f"in.{k}.{i}"] = _np(x)
        for j, t in enumerate(t for t in pytree.tree_leaves(y) if isinstance(t, torch.Tensor)):
            ref[f"out.{k}.{j}"] = _np(t)
    # cuda_refs.py rebuilds the module from the recipe and these weights to make the eager-on-CUDA reference
    ref["recipe"] = np.array(recipe)
    torch.save(m.state_dict(), out / f"{name}.weights.pt")
    np.savez(out / f"{name}.ref.npz", **ref)
    print("built", name, flush=True)


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(out: Path, quick: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("mlp", "cnn", "transformer"):
        mod = _example(name)
        ex = mod.example_inputs

        def at(b: int, ex=ex) -> tuple:
            torch.manual_seed(b)
            return tuple(
                torch.randint(0, 1000, (b, *x.shape[1:]))
                if not x.is_floating_point()
                else torch.randn(b, *x.shape[1:])
                for x in ex
            )

        for precision in ("fp32", "bf16"):
            emit(
                out,
                f"example_{name}_{precision}",
                mod.model,
                ex,
                mod.dynamic_shapes,
                [at(2), at(5)],
                f"example:{name}",
                precision,
            )
    for case in CASES[: 8 if quick else None]:
        torch.manual_seed(0)
        model = case.make().eval()
        ex = case.inputs(3)
        sizes = (2, 5) if case.dynamic else (3,)
        cases = []
        for b in sizes:
            torch.manual_seed(b)
            cases.append(case.inputs(b))
        for precision in precisions(case):
            suffix = "" if precision == "fp32" else f"_{precision}"
            emit(out, f"op_{case.name}{suffix}", model, ex, dynamic_shapes(case, ex), cases, f"op:{case.name}", precision)
    for z in ZOO[: 2 if quick else None]:
        torch.manual_seed(0)
        model = FirstOutput(z.make().eval())
        shapes = [(1, 7), (3, 24)] if z.text else [(1, 0), (4, 0)]
        cases = []
        for b, s in shapes:
            torch.manual_seed(b)
            cases.append(zoo_inputs(z, b, s))
        for precision, suffix in (("fp32", ""), ("bf16", "_bf16")):
            emit(out, f"zoo_{z.name}{suffix}", model, zoo_inputs(z, 2), zoo_dynamic(z), cases, f"zoo:{z.name}", precision)
        if z.text:  # with a padding mask, as tokenizer batches come
            torch.manual_seed(0)
            masked = WithMask(z.make())
            cases = []
            for b, s in [(2, 5), (4, 24)]:
                torch.manual_seed(b)
                cases.append(padded_inputs(b, s))
            for precision, suffix in (("fp32", ""), ("bf16", "_bf16")):
                emit(out, f"zoo_{z.name}_masked{suffix}", masked, padded_inputs(3, 16), padded_dynamic_shapes(), cases,
                     f"zoo_masked:{z.name}", precision)  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--quick" in sys.argv)
