"""Run the generated Triton kernels of tests/gpu/programs.py cases on the CPU with Triton's interpreter.

    TRITON_INTERPRET=1 python tests/triton_interpret.py CASE [CASE ...]

Prints one JSON line per case: whether every output matches the case's numpy reference at its last symbol
values. The interpreter must be switched on before triton is imported, hence a separate process.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton.language as tl
from triton.runtime.interpreter import TensorHandle

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import programs
from aotc import shapes
from aotc_build import kernel_interp
from aotc_build.codegen import triton as tg
from aotc_build.options import BuildOptions


class NumpyLibdevice:
    """The libdevice calls the generator emits, for the interpreter (which has no libdevice)."""

    @staticmethod
    def _wrap(fn: Any, *xs: Any) -> Any:
        first = next(x for x in xs if isinstance(x, tl.tensor))
        data = fn(*[x.handle.data if isinstance(x, tl.tensor) else x for x in xs])
        return tl.tensor(TensorHandle(np.asarray(data).astype(first.handle.data.dtype), first.handle.dtype), first.type)

    def tanh(self, x: Any) -> Any:
        return self._wrap(np.tanh, x)

    def pow(self, a: Any, b: Any) -> Any:
        return self._wrap(np.power, a, b)


def _bf16_dot_fix() -> None:
    """Triton's interpreter multiplies bf16 dot operands as their raw uint16 bits; widen them first."""
    from triton.runtime import interpreter as it

    orig = it.InterpreterBuilder.create_dot

    def widen(h: Any) -> Any:
        if h.dtype.scalar != tl.bfloat16:
            return h
        return TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        return orig(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    it.InterpreterBuilder.create_dot = create_dot


_bf16_dot_fix()


def tensor(a: np.ndarray) -> torch.Tensor:
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(a.copy())


def run(case: programs.Case, tmp: Path) -> dict[str, Any]:
    prog = case.prog
    env = dict(case.trials[-1])

    def shape(b: Any) -> tuple[int, ...]:
        return tuple(int(kernel_interp._int(d, env)) for d in b.shape)

    ins, ws = programs.data(case, env)
    host: dict[str, np.ndarray] = {**ins, **ws}
    bufs = {k: tensor(v) for k, v in host.items()}
    for b in (*prog.outputs, *prog.arena):
        bufs[b.name] = tensor(np.full(shape(b), np.nan if b.dtype.is_float else 7).astype(b.dtype.numpy()))
    for k in prog.kernels:
        tk = tg.generate(prog, k, BuildOptions(precision=case.precision), 90)
        path = tmp / f"{case.name}_{tk.name}.py"
        path.write_text(tk.source)
        spec = importlib.util.spec_from_file_location(f"interp_{case.name}_{tk.name}", path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.libdevice = NumpyLibdevice()  # looked up when the kernel body runs
        args = [bufs[p.source[1]] if p.source[0] == "buffer" else shapes.evaluate(p.source[1], env) for p in tk.params]
        grid = tuple(shapes.evaluate(g, env) for g in tk.grid)
        with np.errstate(all="ignore"):
            getattr(mod, tk.name)[grid](*args, **dict(tk.constexprs))
    want = case.ref({b.name: host[b.name] for b in prog.inputs}, {b.name: host[b.name] for b in prog.weights})
    out: dict[str, Any] = {"case": case.name, "ok": True, "outputs": {}}
    for b in prog.outputs:
        got = (bufs[b.name].float() if b.dtype.value == "bfloat16" else bufs[b.name]).numpy().astype(np.float64)
        w = np.asarray(want[b.name], np.float64).reshape(got.shape)
        both_nan = np.isnan(got) & np.isnan(w)  # NaN where the reference has NaN (as assert_allclose counts it)
        diff = np.where(both_nan, 0.0, np.abs(got - w))
        ok = bool(np.all(both_nan | (diff <= case.atol + case.rtol * np.abs(w))))
        out["outputs"][b.name] = {"ok": ok, "max_abs": float(diff.max(initial=0)), "nan_mismatch": int(np.isnan(diff).sum())}
        out["ok"] &= ok
    return out


def main(names: list[str]) -> None:
    cases = {c.name: c for c in programs.all_cases()}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                r = run(cases[name], Path(tmp))
            except Exception as e:
                r = {"case": name, "ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
