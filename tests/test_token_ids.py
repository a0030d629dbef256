"""Out-of-range token ids in GPU-resident inputs: the PTX check of aotc.indices, against the stand-in libcuda
(tests/fake_libcuda.py computes the check kernel's effect with numpy). Host arrays are checked by
aotc.model before the call (tests/test_cli_errors.py); the H200 run is tests/gpu/test_token_ids_gpu.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from aotc import cuda, indices
from aotc.errors import InputMismatch
from aotc.schema import IndexRange
from fake_libcuda import FakeLib, Launch, view
from test_cuda_runtime import executor, scale_on_launch, scale_target

TABLE = "embedding weight 'wte.weight'"


def _emulate_checks(lib: FakeLib) -> None:
    """The check kernels' effect: flag = 1 when any id is outside [0, size) (compared unsigned, as the PTX)."""
    model = lib.on_launch
    for name in indices.KERNELS.values():
        lib.params[name] = ["ptr", "i64", "i64", "ptr"]

    def run(launch: Launch) -> None:
        if launch.kernel in indices.KERNELS.values():
            ptr, n, size, flag = launch.args
            ids = view(ptr, np.dtype("int64" if launch.kernel.endswith("i64") else "int32"), n)
            if (ids.astype(np.int64).view(np.uint64) >= size).any():
                view(flag, np.dtype(np.int32), 1)[0] = 1
        elif model is not None:
            model(launch)

    lib.on_launch = run


def _executor(lib: FakeLib, kind: str = "i64", **kw: Any) -> cuda.CudaExecutor:
    dtype = {"i64": np.int64, "i32": np.int32}[kind]
    scale_on_launch(lib, np.dtype(dtype))
    _emulate_checks(lib)
    m, t = scale_target(kind, value=1)
    lib.params["scale"] = [p.kind for p in t.kernels[0].params]  # scale_on_launch declares an f32 scalar
    m = dataclasses.replace(m, index_ranges=(IndexRange("x", 100, TABLE),))
    return executor(m, t, **kw)


def _checks(lib: FakeLib) -> int:
    return sum(1 for x in lib.launches if x.kernel in indices.KERNELS.values())


@pytest.mark.parametrize("kind", ["i64", "i32"])
@pytest.mark.parametrize("graph", [False, True])
def test_device_ids_out_of_range_are_input_mismatch(fake: FakeLib, kind: str, graph: bool) -> None:
    ex = _executor(fake, kind)
    dtype = np.int64 if kind == "i64" else np.int32
    good = np.arange(10, dtype=dtype) * 11  # 0 .. 99
    for _ in range(2):  # the second call replays the graph: the check still runs, outside it
        (y,) = ex.run([ex.to_device(good)], {"n": 10}, graph=graph)
        np.testing.assert_array_equal(y, good)
    assert _checks(fake) == 2
    for at, value in ((3, 100), (7, -2), (0, 2**31 - 1)):
        bad = good.copy()
        bad[at] = value
        with pytest.raises(InputMismatch) as e:
            ex.run([ex.to_device(bad)], {"n": 10}, graph=graph)
        msg = str(e.value)
        assert f"input 'x': value {value} at [{at}] is outside [0, 100)" in msg and "vocabulary size 100" in msg, msg
    (y,) = ex.run([ex.to_device(good)], {"n": 10}, graph=graph)  # a refusal leaves the executor usable
    np.testing.assert_array_equal(y, good)


def test_host_ids_are_not_checked_twice(fake: FakeLib) -> None:
    """numpy inputs were checked by aotc.model before the call: no check kernel for them."""
    ex = _executor(fake)
    ex.run([np.arange(10, dtype=np.int64)], {"n": 10})
    assert _checks(fake) == 0
    ex.run([ex.to_device(np.zeros(0, np.int64))], {"n": 0})  # nothing to check: no launch either
    assert _checks(fake) == 0


def test_close_frees_the_flags(fake: FakeLib) -> None:
    """The check owns its flags' device memory: close() leaves nothing of the executor allocated."""
    ex = _executor(fake)
    ex.run([ex.to_device(np.arange(10, dtype=np.int64))], {"n": 10})
    assert ex._ids.flag0 in fake.mem
    ex.close()
    assert ex._ids.flag0 == 0 and not fake.mem


def test_no_index_inputs_no_module(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target())
    assert not ex._ids.ranges and fake.calls.count("cuModuleLoadData") == 1  # the kernel's cubin only


def test_ptx_is_well_formed() -> None:
    """Both entries, with their four u64 parameters, in one module the driver JIT-compiles (sm_70 and up)."""
    assert indices.PTX.startswith(".version 7.0\n.target sm_70\n.address_size 64\n")
    for name in indices.KERNELS.values():
        assert f".visible .entry {name}(.param .u64 p_ids, .param .u64 p_n, .param .u64 p_size, .param .u64 p_flag)" in indices.PTX
    assert indices.PTX.count("setp.ge.u64 %p2, %rd10, %rd3;") == 2  # unsigned: a negative id fails too


def test_ptx_assembles_for_sm80_and_sm90(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What the driver will JIT: Triton's bundled ptxas accepts the module for both targets aotc builds."""
    import subprocess
    from pathlib import Path

    triton = pytest.importorskip("triton")
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("no ptxas bundled with this triton")
    src = tmp_path / "check.ptx"
    src.write_text(indices.PTX)
    for arch in ("sm_80", "sm_90"):
        r = subprocess.run([str(ptxas), f"-arch={arch}", str(src), "-o", str(tmp_path / f"{arch}.cubin")],
                           capture_output=True, text=True, check=False)  # fmt: skip
        assert r.returncode == 0, r.stderr
