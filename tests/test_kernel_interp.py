"""The kernel interpreter against plain numpy/torch, on the hand-built Programs of tests/gpu/programs.py.

Every case of that one table (``programs.CASES``) runs here at each of its symbol values; test_codegen_cpp.py
checks compiled C++ against this interpreter and the same numpy references.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import sympy
from aotc_build import kernel as K
from aotc_build.kernel_interp import eval_index, run_program

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import programs  # the one table of kernel programs (tests/gpu/programs.py)
from programs import BATCH, F32, S0, Case, buf, i0, ld, program, st

CASES = programs.all_cases()
TRIALS = [(case, env) for case in CASES for env in case.trials]
Array = np.ndarray


def trial_id(trial: object) -> str:
    assert isinstance(trial, tuple)
    case, env = trial
    return f"{case.name}-" + ",".join(f"{k}={v}" for k, v in env.items())


def case_data(case: Case, env: dict[str, int]) -> tuple[list[Array], list[Array]]:
    """Inputs and weights in buffer order, seeded by the case's name and symbol values."""
    ins, ws = programs.data(case, env, seed=1000 * sum(env.values()) + sum(map(ord, case.name)))
    return [ins[b.name] for b in case.prog.inputs], [ws[b.name] for b in case.prog.weights]


def reference(case: Case, ins: list[Array], ws: list[Array]) -> list[Array]:
    """The numpy reference's outputs in buffer order."""
    p = case.prog
    want = case.ref({b.name: a for b, a in zip(p.inputs, ins, strict=True)}, {b.name: a for b, a in zip(p.weights, ws, strict=True)})
    assert sorted(want) == sorted(b.name for b in p.outputs), f"{case.name}: reference outputs"
    return [np.asarray(want[b.name]) for b in p.outputs]


def assert_close(got: Array, want: Array, case: Case, what: str) -> None:
    got_f = np.asarray(got).astype(np.float64) if got.dtype.kind in "fV" or got.dtype.itemsize == 2 else got
    want_f = np.asarray(want).astype(np.float64) if got.dtype.kind in "fV" or got.dtype.itemsize == 2 else want
    assert got.shape == tuple(want.shape), f"{case.name} {what}: shape {got.shape} vs {want.shape}"
    if np.asarray(got_f).dtype.kind == "f":
        np.testing.assert_allclose(got_f, want_f, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} {what}")
    else:
        np.testing.assert_array_equal(got_f, want_f, err_msg=f"{case.name} {what}")


# ---- tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trial", TRIALS, ids=trial_id)
def test_interp_matches_numpy(trial: tuple[Case, dict[str, int]]) -> None:
    case, env = trial
    ins, ws = case_data(case, env)
    got = run_program(case.prog, ins, ws, env)
    want = reference(case, ins, ws)
    assert len(got) == len(want)
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, w, case, f"output {j} ({case.prog.outputs[j].name}) at {env}")


def test_eval_index_floor_mod() -> None:
    i = np.arange(-5, 6)
    x = sympy.Symbol("x", integer=True)
    np.testing.assert_array_equal(eval_index(sympy.floor(x / 3), {"x": i}), i // 3)
    np.testing.assert_array_equal(eval_index(sympy.Mod(x, 4), {"x": i}), i % 4)
    np.testing.assert_array_equal(eval_index(sympy.ceiling(x / 2), {"x": i}), -((-i) // 2))
    np.testing.assert_array_equal(eval_index(sympy.Max(x, 2) * 2, {"x": i}), np.maximum(i, 2) * 2)


def test_unmasked_out_of_range_load_is_an_error() -> None:
    k = K.Pointwise("oob", (S0,), (st("y", i0, ld("x", i0 + 1)),))
    prog = program(BATCH, [buf("x", F32, (S0,), "input")], [buf("y", F32, (S0,), "output")], [], [k])
    with pytest.raises(IndexError, match="oob"):
        run_program(prog, [np.ones(3, np.float32)], [], {"s0": 3})
