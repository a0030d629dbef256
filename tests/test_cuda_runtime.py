"""aotc.cuda on a machine without a GPU: the executor against a stand-in libcuda (tests/fake_libcuda.py).

The stand-in's "device" memory is host memory and each launch is computed by the kernel interpreter, so
these tests check what a GPU run depends on besides the cubins themselves: the manifest format and its
refusals, argument packing at PTX widths, buffer placement (weights, arena offsets, staging), scratch
pointers, cuLaunchKernelEx attributes, CUDA-graph capture and replay, zero-copy inputs, sticky faults.
"""

from __future__ import annotations

import copy
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aotc import cuda, cuda_plan
from aotc.cuda_driver import DeviceArray, Driver, new_ffi
from aotc.errors import DeviceError, IncompatiblePackage, InputMismatch, PackageCorrupt
from aotc_build import cubin, kernel_interp
from aotc_build.options import BuildOptions, Target
from fake_libcuda import FakeLib, Launch, view

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import programs


def fake_cubin(sm: int = 90, ptxas: str = "13.4") -> bytes:
    head = bytearray(64)
    head[:5] = b"\x7fELF\x02"
    struct.pack_into("<H", head, 0x12, 190)
    struct.pack_into("<I", head, 0x30, (sm << 8) if int(ptxas.split(".", maxsplit=1)[0]) >= 13 else sm)
    return bytes(head)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeLib:
    ffi = new_ffi()
    lib = FakeLib(ffi)
    drv = Driver(lib=lib, ffi=ffi)
    monkeypatch.setattr(cuda, "driver", lambda: drv)
    lib.drv = drv  # type: ignore[attr-defined]
    return lib


def scale_target(kind: str = "f32", value: Any = 2.5, **kernel: Any) -> dict[str, Any]:
    """y = x * s over n elements: one kernel whose third parameter is a ``kind`` scalar."""
    dtype = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i1": "int8",
             "i8": "int8", "i32": "int32", "i64": "int64"}[kind]  # fmt: skip
    k = cuda_plan.Kernel(
        name="scale", member="cuda/sm_90/scale.cubin", num_warps=4, ptxas_version="13.4",
        params=(("ptr", 8), ("ptr", 8), (kind, cuda_plan.SCALAR_BYTES[kind]), ("i32", 4),
                ("global_scratch", 8), ("profile_scratch", 8)), **{"shared": 0, **kernel},
    )  # fmt: skip
    t = cuda_plan.CudaTarget(
        arch="sm_90", triton_version="3.9.0", ptxas_version="13.4", min_driver=13000, symbols=("n",),
        inputs=(cuda_plan.Tensor("x", dtype, ("n",)),), outputs=(cuda_plan.Tensor("y", dtype, ("n",)),),
        weights=(), arena_bytes=0, arena=(), kernels=(k,),
        launches=(cuda_plan.Launch("scale", ("CeilDiv(n, 256)", 1, 1), (
            cuda_plan.Arg("ptr", buffer="x"), cuda_plan.Arg("ptr", buffer="y"),
            cuda_plan.Arg(kind, value=value), cuda_plan.Arg("i32", expr="n"))),),
    )  # fmt: skip
    return t.to_dict()


def scale_on_launch(lib: FakeLib, dtype: np.dtype) -> None:
    def run(launch: Launch) -> None:
        x_ptr, y_ptr, s, n = launch.args[:4]
        if dtype.name == "bfloat16":
            s = struct.unpack("<f", struct.pack("<I", s << 16))[0]
        x = view(x_ptr, dtype, n)
        y = view(y_ptr, dtype, n)
        y[:] = (x.astype(np.float64) * float(s)).astype(dtype)

    lib.params["scale"] = [p["kind"] for p in scale_target()["kernels"][0]["params"]]
    lib.on_launch = run


# ---- the manifest format ------------------------------------------------------------------------------


def test_plan_round_trip() -> None:
    raw = scale_target()
    t = cuda_plan.parse(raw)
    assert t.to_dict() == raw
    assert t.kernels[0].num_args == 4 and t.sm == 90


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (("format",), 2, "format 2"),
        (("arch",), "90", "sm_NN"),
        (("kernels", 0, "params", 2, "bytes"), 8, "not a known parameter"),
        (("kernels", 0, "member"), "../etc/passwd", "member"),
        (("launches", 0, "args"), [], "whose PTX takes 4"),
        (("launches", 0, "args", 0, "buffer"), "nope", "names no buffer"),
        (("launches", 0, "args", 3, "expr"), "m + 1", "unknown symbols"),
        (("launches", 0, "args", 3, "expr"), "__import__('os')", "outside the grammar"),
        (("launches", 0, "kernel"), "other", "names no kernel"),
        (("launches", 0, "grid"), [1, 1], "3 sizes"),
        (("symbols",), ["n", 3], "symbol name"),
        (("inputs", 0, "dtype"), "complex64", "unknown dtype"),
        (("min_driver",), "13000", "expected int"),
    ],
)
def test_plan_refuses_malformed(path: tuple[Any, ...], value: Any, words: str) -> None:
    raw = copy.deepcopy(scale_target())
    d = raw
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    with pytest.raises(PackageCorrupt, match=words.replace("(", r"\(").replace("+", r"\+")):
        cuda_plan.parse(raw)


# ---- without libcuda -----------------------------------------------------------------------------------


def test_no_libcuda_refuses_clearly() -> None:
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has libcuda")
    assert cuda.available() is False
    assert cuda.pick_target([{"kind": "cpu"}]) is None
    with pytest.raises(IncompatiblePackage, match="libcuda"):
        cuda.pick_target([scale_target()])


# ---- argument packing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "value", "want"),
    [
        ("f16", 1.5, struct.pack("<e", 1.5)),
        ("bf16", -2.5, struct.pack("<H", 0xC020)),
        ("f32", 0.1, struct.pack("<f", 0.1)),  # 4 bytes, not a double
        ("f64", 1 / 3, struct.pack("<d", 1 / 3)),
        ("i1", True, b"\x01"),
        ("i8", -3, b"\xfd"),
        ("i32", 123457, struct.pack("<i", 123457)),
        ("i64", 2**40 + 3, struct.pack("<q", 2**40 + 3)),
    ],
)
def test_scalar_packed_at_ptx_width(fake: FakeLib, kind: str, value: Any, want: bytes) -> None:
    raw = scale_target(kind, value)
    fake.params["scale"] = [p["kind"] for p in raw["kernels"][0]["params"]]
    ex = cuda.CudaExecutor(raw, {"cuda/sm_90/scale.cubin": fake_cubin()}, [])
    dt = cuda.np_dtype(raw["inputs"][0]["dtype"])
    ex.run([np.zeros(10, dt)], {"n": 10}, graph=False)
    (launch,) = fake.launches
    assert launch.raw[16 : 16 + len(want)] == want
    assert launch.args[3] == 10 and launch.grid == (1, 1, 1) and launch.block == 128
    assert launch.args[4] == 0 and launch.args[5] == 0  # no scratch: null pointers


def test_symbol_too_large_for_i32(fake: FakeLib) -> None:
    raw = scale_target()
    scale_on_launch(fake, np.dtype(np.float32))
    ex = cuda.CudaExecutor(raw, {"cuda/sm_90/scale.cubin": fake_cubin()}, [])
    with pytest.raises(InputMismatch, match="does not fit i32"):
        ex.run([np.zeros(3, np.float32)], {"n": 2**31})


# ---- running ------------------------------------------------------------------------------------------


def test_scale_end_to_end_plain_graph_and_zero_copy(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = cuda.CudaExecutor(scale_target(), {"cuda/sm_90/scale.cubin": fake_cubin()}, [])
    for n in (5, 1000, 5):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        (y,) = ex.run([x], graph=False)  # n is read from the input's shape
        np.testing.assert_array_equal(y, (x * np.float32(2.5)).astype(np.float32))
        (y,) = ex.run([x])
        np.testing.assert_array_equal(y, x * np.float32(2.5))
        dx, dy = ex.to_device(x), ex.empty((n,), "float32")
        (out,) = ex.run([dx], outputs=[dy])
        assert out is dy
        np.testing.assert_array_equal(dy.numpy(), x * np.float32(2.5))
        (d,) = ex.run([x], device_outputs=True)
        assert isinstance(d, DeviceArray) and d.__cuda_array_interface__["shape"] == (n,)
        np.testing.assert_array_equal(d.numpy(), x * np.float32(2.5))
    assert fake.calls.count("cuGraphLaunch") == 9  # one graph per n, replayed
    assert ex.graph_error is None


def test_misaligned_device_input_is_staged(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = cuda.CudaExecutor(scale_target(), {"cuda/sm_90/scale.cubin": fake_cubin()}, [])
    x = np.arange(9, dtype=np.float32)
    big = ex.to_device(x)
    shifted = DeviceArray(fake.drv, big.ptr + 4, (8,), np.dtype(np.float32), owned=False)  # type: ignore[attr-defined]
    (y,) = ex.run([shifted])
    np.testing.assert_array_equal(y, x[1:] * 2.5)
    x_ptr = fake.launches[-1].args[0]
    assert x_ptr % 16 == 0 and x_ptr != shifted.ptr


def test_host_pointer_in_disguise_is_refused(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = cuda.CudaExecutor(scale_target(), {"cuda/sm_90/scale.cubin": fake_cubin()}, [])
    host = np.zeros(4, np.float32)
    fake_dev = DeviceArray(fake.drv, host.ctypes.data, (4,), np.dtype(np.float32), owned=False)  # type: ignore[attr-defined]
    with pytest.raises(InputMismatch, match="not CUDA device memory"):
        ex.run([fake_dev])
    with pytest.raises(InputMismatch, match="expected dtype float32"):
        ex.run([np.zeros(4, np.float64)])


def test_capture_failure_falls_back_to_plain_launches(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    fake.capture_fails = True
    ex = cuda.CudaExecutor(scale_target(), {"cuda/sm_90/scale.cubin": fake_cubin()}, [])
    x = np.ones(7, np.float32)
    (y,) = ex.run([x])
    np.testing.assert_array_equal(y, x * 2.5)
    assert ex.graph_error and "cuStreamEndCapture" in ex.graph_error
    (y,) = ex.run([x])
    np.testing.assert_array_equal(y, x * 2.5)
    assert "cuGraphLaunch" not in fake.calls


def test_fault_is_sticky(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    fake.fail["launch:scale"] = 700
    ex = cuda.CudaExecutor(scale_target(), {"cuda/sm_90/scale.cubin": fake_cubin()}, [], graphs=False)
    with pytest.raises(DeviceError, match=r"ILLEGAL_ADDRESS.*kernel scale.*unusable"):
        ex.run([np.ones(3, np.float32)])
    with pytest.raises(DeviceError, match="earlier fault"):
        ex.run([np.ones(3, np.float32)])


@pytest.mark.parametrize(
    ("kernel", "attrs", "grid_x"),
    [
        ({"num_ctas": 2}, [4, 5], 8),
        ({"launch_pdl": True}, [6], 4),
        ({"launch_cooperative_grid": True}, [2], 4),
    ],
)
def test_launch_ex_attributes(fake: FakeLib, kernel: dict[str, Any], attrs: list[int], grid_x: int) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = cuda.CudaExecutor(scale_target(**kernel), {"cuda/sm_90/scale.cubin": fake_cubin()}, [])
    ex.run([np.ones(1000, np.float32)], graph=False)
    assert fake.launches[-1].ex and fake.launches[-1].grid == (grid_x, 1, 1)
    assert f"ex attrs={attrs}" in fake.calls


def test_global_scratch_and_large_shared(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    raw = scale_target(global_scratch_size=256, global_scratch_align=128, shared=100_000)
    ex = cuda.CudaExecutor(raw, {"cuda/sm_90/scale.cubin": fake_cubin()}, [])
    assert "cuFuncSetAttribute(8, 100000)" in fake.calls
    ex.run([np.ones(1000, np.float32)], graph=False)
    launch = fake.launches[-1]
    assert launch.args[4] != 0 and launch.args[4] % 128 == 0 and launch.args[5] == 0
    assert launch.shared == 100_000
    assert ex._gscratch.size >= 4 * 256  # grid of 4 programs x 256 bytes


# ---- refusals -------------------------------------------------------------------------------------------


def test_other_arch_and_old_driver_refused(fake: FakeLib) -> None:
    raw = scale_target()
    fake.cc = (8, 0)
    with pytest.raises(IncompatiblePackage, match=r"sm_90.*sm_80.*--target cuda:sm_80"):
        cuda.pick_target([raw])
    fake.cc = (9, 0)
    fake.drv._devices.clear()  # type: ignore[attr-defined]
    assert cuda.pick_target([{"kind": "cpu"}, raw]) == raw
    fake.drv.version = 12080  # type: ignore[attr-defined]
    with pytest.raises(IncompatiblePackage, match=r"CUDA 12\.8.*need CUDA 13\.0"):
        cuda.pick_target([raw])


def test_sm80_cubin_runs_on_sm86_but_sm90_only_on_sm90(fake: FakeLib) -> None:
    from aotc.cuda_driver import Device

    def dev(cc: tuple[int, int]) -> Device:
        return Device(0, 0, "x", cc, 1, 1, 1)

    assert cuda.runs_on("sm_80", dev((8, 6))) and not cuda.runs_on("sm_86", dev((8, 0)))
    assert cuda.runs_on("sm_90", dev((9, 0))) and not cuda.runs_on("sm_90", dev((10, 0)))
    assert not cuda.runs_on("sm_80", dev((9, 0)))


def test_bad_members_refused(fake: FakeLib) -> None:
    raw = scale_target()
    with pytest.raises(PackageCorrupt, match="missing"):
        cuda.CudaExecutor(raw, {}, [])
    with pytest.raises(PackageCorrupt, match="not a CUDA ELF"):
        cuda.CudaExecutor(raw, {"cuda/sm_90/scale.cubin": b"\x7fELF" + b"\0" * 100}, [])
    with pytest.raises(PackageCorrupt, match="for sm_80"):
        cuda.CudaExecutor(raw, {"cuda/sm_90/scale.cubin": fake_cubin(80)}, [])


# ---- whole programs: real Triton cubins, launches computed by the kernel interpreter -------------------


FAST = ["pointwise_permute", "masked_pad", "gather", "softmax", "layer_norm", "linear_relu", "batched_matmul",
        "conv_grouped", "cumsum", "two_kernels_arena"]  # fmt: skip


def interp_launches(fake: FakeLib, case: programs.Case, raw: dict[str, Any], env: dict[str, int]) -> None:
    prog = case.prog
    fake.params.update({k["name"]: [p["kind"] for p in k["params"]] for k in raw["kernels"]})
    count = [0]

    def run(launch: Launch) -> None:
        j = count[0] % len(prog.kernels)
        count[0] += 1
        spec = raw["launches"][j]
        assert spec["kernel"] == launch.kernel
        bufs = {}
        for a, v in zip(spec["args"], launch.args, strict=False):
            if a["kind"] == "ptr":
                b = prog.buffer(a["buffer"])
                n = kernel_interp._int(b.numel(), env)
                bufs[b.name] = view(v, b.dtype.numpy(), n)
            elif "expr" in a:
                from aotc.shapes import evaluate

                assert v == evaluate(a["expr"], env)
        kernel_interp._KERNELS[type(prog.kernels[j])](prog.kernels[j], bufs, env)

    fake.on_launch = run


@pytest.mark.parametrize("name", FAST)
def test_program_through_executor(fake: FakeLib, name: str, tmp_path: Path) -> None:
    case = next(c for c in programs.all_cases() if c.name == name)
    raw, members = cubin.build_cuda_target(
        case.prog, Target("cuda", "sm_90"), BuildOptions(precision=case.precision), tmp_path.parent / "cubins"
    )
    rng = np.random.default_rng(0)
    t = cuda_plan.parse(raw)
    weights = {w.name: rng.standard_normal([int(d) for d in w.shape]).astype(np.float32) for w in t.weights}
    ex = cuda.CudaExecutor(raw, members, [weights[w.name] for w in t.weights])
    for env in (*case.trials, case.trials[0]):
        interp_launches(fake, case, raw, env)
        inputs = []
        for x in t.inputs:
            shape = tuple(int(kernel_interp._int(programs.sympy.sympify(d), env)) for d in case.prog.buffer(x.name).shape)
            hi = case.int_inputs.get(x.name)
            a = rng.integers(0, hi, shape) if hi else rng.standard_normal(shape)
            inputs.append(a.astype(cuda.np_dtype(x.dtype)))
        want = case.ref(dict(zip([x.name for x in t.inputs], inputs, strict=True)), weights)
        for graph in (False, True):
            outs = ex.run(inputs, env, graph=graph)
            for o, got in zip(t.outputs, outs, strict=True):
                np.testing.assert_allclose(got.astype(np.float64), want[o.name], rtol=1e-4, atol=1e-4)
    assert ex.graph_error is None
