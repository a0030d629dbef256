"""aotc.cuda on a machine without a GPU: the executor against a stand-in libcuda (tests/fake_libcuda.py).

The stand-in's "device" memory is host memory and each launch is computed by the kernel interpreter, so
these tests check what a GPU run depends on besides the cubins themselves: the manifest format and its
refusals, argument packing at PTX widths, buffer placement (weights, arena offsets, staging), scratch
pointers, cuLaunchKernelEx attributes, CUDA-graph capture and replay, zero-copy inputs, sticky faults.
"""

from __future__ import annotations

import copy
import dataclasses
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aotc import cuda, schema
from aotc.cuda_driver import DeviceArray
from aotc.errors import DeviceError, IncompatiblePackage, InputMismatch, PackageCorrupt
from aotc.schema import Arg, CudaTarget, Manifest, ModelInfo, Ref, Symbol, TensorSpec, Weights
from aotc_build import cubin, kernel_interp
from aotc_build.options import BuildOptions, Target
from fake_libcuda import FakeLib, Launch, view

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import programs
from build_artifacts import program_manifest


def fake_cubin(sm: int = 90, ptxas: str = "13.4") -> bytes:
    head = bytearray(64)
    head[:5] = b"\x7fELF\x02"
    struct.pack_into("<H", head, 0x12, 190)
    struct.pack_into("<I", head, 0x30, (sm << 8) if int(ptxas.split(".", maxsplit=1)[0]) >= 13 else sm)
    return bytes(head)


def scale_target(kind: str = "f32", value: Any = 2.5, **kernel: Any) -> tuple[Manifest, CudaTarget]:
    """y = x * s over n elements: one kernel whose third parameter is a ``kind`` scalar."""
    dtype = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i1": "int8",
             "i8": "int8", "i32": "int32", "i64": "int64"}[kind]  # fmt: skip
    params = tuple(schema.Param(k, schema.PARAM_BYTES[k]) for k in ("ptr", "ptr", kind, "i32", *schema.SCRATCH))
    k = schema.Kernel(
        name="scale", member="cuda/sm_90/scale.cubin", num_warps=4, ptxas_version="13.4", params=params,
        **{"shared": 0, **kernel},
    )  # fmt: skip
    t = CudaTarget(
        arch="sm_90", triton_version="3.9.0", ptxas_version="13.4", min_driver=13000, precision="fp32",
        arena_bytes=0, arena=(), kernels=(k,),
        launches=(schema.Launch("scale", ("CeilDiv(n, 256)", 1, 1), (
            Arg("ptr", buffer=Ref("input", 0)), Arg("ptr", buffer=Ref("output", 0)),
            Arg(kind, value=value), Arg("i32", expr="n"))),),
    )  # fmt: skip
    m = Manifest(
        model=ModelInfo("scale", "0" * 64), build={"aotc": "test"}, symbols=(Symbol("n", "n", 0, None),),
        inputs=(TensorSpec("x", dtype, ("n",)),), outputs=(TensorSpec("y", dtype, ("n",)),),
        weights=Weights("weights.safetensors", ()), targets=(t,),
    )  # fmt: skip
    return m, t


def executor(m: Manifest, t: CudaTarget, image: bytes | None = None, **kw: Any) -> cuda.CudaExecutor:
    return cuda.CudaExecutor(m, t, {"cuda/sm_90/scale.cubin": image or fake_cubin()}, [], **kw)


def scale_on_launch(lib: FakeLib, dtype: np.dtype) -> None:
    def run(launch: Launch) -> None:
        x_ptr, y_ptr, s, n = launch.args[:4]
        if dtype.name == "bfloat16":
            s = struct.unpack("<f", struct.pack("<I", s << 16))[0]
        x = view(x_ptr, dtype, n)
        y = view(y_ptr, dtype, n)
        y[:] = (x.astype(np.float64) * float(s)).astype(dtype)

    lib.params["scale"] = [p.kind for p in scale_target()[1].kernels[0].params]
    lib.on_launch = run


# ---- the manifest format ------------------------------------------------------------------------------


def test_cuda_target_round_trip() -> None:
    m, t = scale_target()
    text = schema.to_json(m)
    again = schema.from_json(text)
    assert again == m and schema.to_json(again) == text
    assert again.cuda_targets[0].kernels[0].num_args == 4 and again.cuda_targets[0].sm == 90
    assert "cuda/sm_90/scale.cubin" in again.referenced_members()  # so its sha256 is required


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (("kernels", 0, "color"), "blue", r"targets\[0\]\.kernels\[0\]\.color.*unknown field"),
        (("launches", 0, "args", 0, "buffer", "spare"), 1, r"launches\[0\]\.args\[0\]\.buffer\.spare.*unknown"),
        (("arch",), "90", "sm_NN"),
        (("kernels", 0, "params", 2, "bytes"), 8, r"params\[2\].*not a known parameter"),
        (("kernels", 0, "params", 1, "kind"), "global_scratch", r"params\[1\].*not a known parameter"),
        (("kernels", 0, "member"), "../etc/passwd", "member"),
        (("kernels", 0, "num_warps"), 0, "num_warps.*at least 1"),
        (("launches", 0, "args"), [], "whose PTX takes 4"),
        (("launches", 0, "args", 0, "buffer", "index"), 1, "names no buffer"),
        (("launches", 0, "args", 0, "buffer", "group"), "scratch", "expected one of"),
        (("launches", 0, "args", 2, "kind"), "f64", "parameter is 'f32'"),
        (("launches", 0, "args", 3, "expr"), "m + 1", "undeclared symbol 'm'"),
        (("launches", 0, "args", 3, "expr"), "__import__('os')", r"args\[3\]\.expr"),
        (("launches", 0, "args", 3, "value"), 3, "exactly one expr"),
        (("launches", 0, "kernel"), "other", "names no kernel"),
        (("launches", 0, "grid"), [1, 1], "expected 3 entries"),
        (("min_driver",), "13000", "expected int"),
    ],
)
def test_cuda_target_refuses_malformed(path: tuple[Any, ...], value: Any, words: str) -> None:
    d = schema.to_dict(scale_target()[0])
    node = d["targets"][0]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    with pytest.raises(PackageCorrupt, match=words):
        schema.from_dict(copy.deepcopy(d))


# ---- without libcuda -----------------------------------------------------------------------------------


def test_no_libcuda_refuses_clearly() -> None:
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has libcuda")
    assert cuda.available() is False
    assert cuda.pick_target([]) is None
    with pytest.raises(IncompatiblePackage, match="libcuda"):
        cuda.pick_target([scale_target()[1]])


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
    m, t = scale_target(kind, value)
    fake.params["scale"] = [p.kind for p in t.kernels[0].params]
    ex = executor(m, t)
    dt = cuda.np_dtype(m.inputs[0].dtype)
    ex.run([np.zeros(10, dt)], {"n": 10}, graph=False)
    (launch,) = fake.launches
    assert launch.raw[16 : 16 + len(want)] == want
    assert launch.args[3] == 10 and launch.grid == (1, 1, 1) and launch.block == 128
    assert launch.args[4] == 0 and launch.args[5] == 0  # no scratch: null pointers


def test_symbol_too_large_for_i32(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target())
    with pytest.raises(InputMismatch, match="does not fit i32"):
        ex.run([np.zeros(3, np.float32)], {"n": 2**31})


# ---- running ------------------------------------------------------------------------------------------


def test_scale_end_to_end_plain_graph_and_zero_copy(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target())
    for n in (5, 1000, 5):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        (y,) = ex.run([x], {"n": n}, graph=False)
        np.testing.assert_array_equal(y, (x * np.float32(2.5)).astype(np.float32))
        (y,) = ex.run([x], {"n": n})
        np.testing.assert_array_equal(y, x * np.float32(2.5))
        dx, dy = ex.to_device(x), ex.empty((n,), "float32")
        (out,) = ex.run([dx], {"n": n}, outputs=[dy])
        assert out is dy
        np.testing.assert_array_equal(dy.numpy(), x * np.float32(2.5))
        (d,) = ex.run([x], {"n": n}, device_outputs=True)
        assert isinstance(d, DeviceArray) and d.__cuda_array_interface__["shape"] == (n,)
        np.testing.assert_array_equal(d.numpy(), x * np.float32(2.5))
    assert fake.calls.count("cuGraphLaunch") == 9  # one graph per n, replayed
    assert ex.graph_error is None


def test_profile_times_each_launch_alone(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target())
    x = np.arange(6, dtype=np.float32)
    rows = ex.profile([x], {"n": 6}, repeats=5)
    assert rows == [("scale", pytest.approx(0.01))]  # the fake charges 10 us per launch
    assert len(fake.launches) == 1 + 5
    (y,) = ex.run([x], {"n": 6})
    np.testing.assert_array_equal(y, x * np.float32(2.5))


def test_new_addresses_reuse_the_graph_through_staging(fake: FakeLib) -> None:
    """Two address sets get graphs of their own; a third is copied through staging into a third graph that
    every later address shares, so fresh caller arrays each call never capture again."""
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target())
    alive = []  # distinct addresses every call
    for k in range(6):
        x = np.full(8, k, np.float32)
        dx, dy = ex.to_device(x), ex.empty((8,), "float32")
        alive += [dx, dy]
        ex.run([dx], {"n": 8}, outputs=[dy])
        np.testing.assert_array_equal(dy.numpy(), x * np.float32(2.5))
    assert fake.calls.count("cuGraphLaunch") == 6
    assert len(ex._graphs._execs) == 3


def test_dropped_outputs_are_reused_not_freed(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target())
    x = ex.to_device(np.arange(8, dtype=np.float32))
    (first,) = ex.run([x], {"n": 8}, device_outputs=True)
    ptr = first.ptr
    del first
    allocs = fake.calls.count("cuMemAlloc")
    for _ in range(5):
        (y,) = ex.run([x], {"n": 8}, device_outputs=True)
        assert y.ptr == ptr
        np.testing.assert_array_equal(y.numpy(), np.arange(8, dtype=np.float32) * np.float32(2.5))
        del y
    assert fake.calls.count("cuMemAlloc") == allocs
    ex.close()


class _CudaDLPack:
    """A numpy array that says it lives on cuda:0 through DLPack (the fake's device memory is host memory)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.a.__dlpack__()


def test_dlpack_input_used_in_place(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target())
    x = np.arange(16, dtype=np.float32)
    for _ in range(2):  # the second call goes through the checks' cache
        (y,) = ex.run([_CudaDLPack(x)], {"n": 16})
        np.testing.assert_array_equal(y, x * np.float32(2.5))
    with pytest.raises(InputMismatch, match="float32"):
        ex.run([_CudaDLPack(x.astype(np.float64))], {"n": 16})


def test_misaligned_device_input_is_staged(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target())
    x = np.arange(9, dtype=np.float32)
    big = ex.to_device(x)
    shifted = DeviceArray(fake.drv, big.ptr + 4, (8,), np.dtype(np.float32), owned=False)  # type: ignore[attr-defined]
    (y,) = ex.run([shifted], {"n": 8})
    np.testing.assert_array_equal(y, x[1:] * 2.5)
    x_ptr = fake.launches[-1].args[0]
    assert x_ptr % 16 == 0 and x_ptr != shifted.ptr


def test_host_pointer_in_disguise_is_refused(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target())
    host = np.zeros(4, np.float32)
    fake_dev = DeviceArray(fake.drv, host.ctypes.data, (4,), np.dtype(np.float32), owned=False)  # type: ignore[attr-defined]
    with pytest.raises(InputMismatch, match="not CUDA device memory"):
        ex.run([fake_dev], {"n": 4})
    with pytest.raises(InputMismatch, match="expected dtype float32"):
        ex.run([np.zeros(4, np.float64)], {"n": 4})


def test_capture_failure_falls_back_to_plain_launches(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    fake.capture_fails = True
    ex = executor(*scale_target())
    x = np.ones(7, np.float32)
    (y,) = ex.run([x], {"n": 7})
    np.testing.assert_array_equal(y, x * 2.5)
    assert ex.graph_error and "cuStreamEndCapture" in ex.graph_error
    (y,) = ex.run([x], {"n": 7})
    np.testing.assert_array_equal(y, x * 2.5)
    assert "cuGraphLaunch" not in fake.calls


def test_fault_is_sticky(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    fake.fail["launch:scale"] = 700
    ex = executor(*scale_target(), graphs=False)
    with pytest.raises(DeviceError, match=r"ILLEGAL_ADDRESS.*kernel scale.*unusable"):
        ex.run([np.ones(3, np.float32)], {"n": 3})
    with pytest.raises(DeviceError, match="earlier fault"):
        ex.run([np.ones(3, np.float32)], {"n": 3})


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
    ex = executor(*scale_target(**kernel))
    ex.run([np.ones(1000, np.float32)], {"n": 1000}, graph=False)
    assert fake.launches[-1].ex and fake.launches[-1].grid == (grid_x, 1, 1)
    assert f"ex attrs={attrs}" in fake.calls


def test_global_scratch_and_large_shared(fake: FakeLib) -> None:
    scale_on_launch(fake, np.dtype(np.float32))
    ex = executor(*scale_target(global_scratch_size=256, global_scratch_align=128, shared=100_000))
    assert "cuFuncSetAttribute(8, 100000)" in fake.calls
    ex.run([np.ones(1000, np.float32)], {"n": 1000}, graph=False)
    launch = fake.launches[-1]
    assert launch.args[4] != 0 and launch.args[4] % 128 == 0 and launch.args[5] == 0
    assert launch.shared == 100_000
    assert ex._gscratch.size >= 4 * 256  # grid of 4 programs x 256 bytes


# ---- refusals -------------------------------------------------------------------------------------------


def test_other_arch_and_old_driver_refused(fake: FakeLib) -> None:
    t = scale_target()[1]
    fake.cc = (8, 0)
    with pytest.raises(IncompatiblePackage, match=r"sm_90.*sm_80.*--target cuda:sm_80"):
        cuda.pick_target([t])
    fake.cc = (9, 0)
    fake.drv._devices.clear()  # type: ignore[attr-defined]
    older = dataclasses.replace(t, arch="sm_80")
    assert cuda.pick_target([older, t]) is t
    fake.drv.version = 12080  # type: ignore[attr-defined]
    with pytest.raises(IncompatiblePackage, match=r"CUDA 12\.8.*need CUDA 13\.0"):
        cuda.pick_target([t])


def test_sm80_cubin_runs_on_sm86_but_sm90_only_on_sm90(fake: FakeLib) -> None:
    from aotc.cuda_driver import Device

    def dev(cc: tuple[int, int]) -> Device:
        return Device(0, 0, "x", cc, 1, 1, 1)

    assert cuda.runs_on("sm_80", dev((8, 6))) and not cuda.runs_on("sm_86", dev((8, 0)))
    assert cuda.runs_on("sm_90", dev((9, 0))) and not cuda.runs_on("sm_90", dev((10, 0)))
    assert not cuda.runs_on("sm_80", dev((9, 0)))


def test_bad_members_refused(fake: FakeLib) -> None:
    m, t = scale_target()
    with pytest.raises(PackageCorrupt, match="missing"):
        cuda.CudaExecutor(m, t, {}, [])
    with pytest.raises(PackageCorrupt, match="not a CUDA ELF"):
        executor(m, t, b"\x7fELF" + b"\0" * 100)
    with pytest.raises(PackageCorrupt, match="for sm_80"):
        executor(m, t, fake_cubin(80))


# ---- whole programs: real Triton cubins, launches computed by the kernel interpreter -------------------


FAST = ["pointwise_permute", "masked_pad", "gather", "softmax", "layer_norm", "linear_relu", "batched_matmul",
        "conv_grouped", "cumsum", "two_kernels_arena"]  # fmt: skip


def interp_launches(fake: FakeLib, case: programs.Case, t: CudaTarget, env: dict[str, int]) -> None:
    prog = case.prog
    fake.params.update({k.name: [p.kind for p in k.params] for k in t.kernels})
    groups = {"input": prog.inputs, "output": prog.outputs, "weight": prog.weights, "arena": prog.arena}
    count = [0]

    def run(launch: Launch) -> None:
        j = count[0] % len(prog.kernels)
        count[0] += 1
        spec = t.launches[j]
        assert spec.kernel == launch.kernel
        bufs = {}
        for a, v in zip(spec.args, launch.args, strict=False):
            if a.buffer is not None:
                b = groups[a.buffer.group][a.buffer.index]
                n = kernel_interp._int(b.numel(), env)
                bufs[b.name] = view(v, b.dtype.numpy(), n)
            elif a.expr is not None:
                from aotc.shapes import evaluate

                assert v == evaluate(a.expr, env)
        kernel_interp._KERNELS[type(prog.kernels[j])](prog.kernels[j], bufs, env)

    fake.on_launch = run


@pytest.mark.parametrize("name", FAST)
def test_program_through_executor(fake: FakeLib, name: str, tmp_path: Path) -> None:
    case = next(c for c in programs.all_cases() if c.name == name)
    t, members = cubin.build_cuda_target(
        case.prog, Target("cuda", "sm_90"), BuildOptions(precision=case.precision), tmp_path.parent / "cubins"
    )
    m = program_manifest(case.prog, t)
    assert schema.from_json(schema.to_json(m)) == m  # the builder never writes what the runtime refuses
    rng = np.random.default_rng(0)
    ws = m.weights.tensors
    weights = {w.name: rng.standard_normal([int(d) for d in w.shape]).astype(np.float32) for w in ws}
    ex = cuda.CudaExecutor(m, t, members, [weights[w.name] for w in ws])
    for env in (*case.trials, case.trials[0]):
        interp_launches(fake, case, t, env)
        inputs = []
        for x in m.inputs:
            shape = tuple(int(kernel_interp._int(programs.sympy.sympify(d), env)) for d in case.prog.buffer(x.name).shape)
            hi = case.int_inputs.get(x.name)
            a = rng.integers(0, hi, shape) if hi else rng.standard_normal(shape)
            inputs.append(a.astype(cuda.np_dtype(x.dtype)))
        want = case.ref(dict(zip([x.name for x in m.inputs], inputs, strict=True)), weights)
        for graph in (False, True):
            outs = ex.run(inputs, env, graph=graph)
            for o, got in zip(m.outputs, outs, strict=True):
                np.testing.assert_allclose(got.astype(np.float64), want[o.name], rtol=1e-4, atol=1e-4)
    assert ex.graph_error is None
