"""The ``aotc`` command line: output of run / verify / inspect, and one exit code per error class."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest
from affine_pkg import affine_manifest, reference
from aotc import cli as cli_mod
from aotc import errors, schema
from aotc.cli import cli
from aotc.schema import FORMAT_VERSION, to_dict
from click.testing import CliRunner
from test_package import flip, write_raw


def invoke(*args: str | Path) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def npy(tmp_path: Path, name: str, arr: np.ndarray) -> str:
    path = tmp_path / f"{name}.npy"
    np.save(path, arr)
    return f"{name}={path}"


def test_help_lists_exit_codes() -> None:
    out = invoke("--help").output
    for name, code in errors.EXIT_CODES.items():
        assert f"{code}  {name}" in out


def test_run_prints_and_saves_outputs(make_package, tmp_path: Path) -> None:
    x = np.ones((3, 4), np.float32)
    s = np.full(3, 2, np.float32)
    r = invoke(
        "run",
        make_package(),
        "--input",
        npy(tmp_path, "x", x),
        "-i",
        npy(tmp_path, "scale", s),
        "-o",
        tmp_path / "o.npz",
    )
    assert r.exit_code == 0, r.output
    assert "y: float32[3, 3]" in r.stdout and "relu: float32[3, 3]" in r.stdout
    with np.load(tmp_path / "o.npz") as z:
        assert list(z.keys()) == ["y", "relu"]
        np.testing.assert_allclose(z["y"], reference(x, s)[0], rtol=1e-6)


def test_run_refusals_have_exit_codes_and_no_traceback(make_package, tmp_path: Path) -> None:
    pkg = make_package()
    big = invoke(
        "run",
        pkg,
        "-i",
        npy(tmp_path, "x", np.ones((65, 4), np.float32)),
        "-i",
        npy(tmp_path, "scale", np.ones(65, np.float32)),
    )
    assert big.exit_code == errors.InputMismatch.exit_code
    assert "InputMismatch: input 'x' axis 0 (batch): got batch=65" in big.stderr and "Traceback" not in big.output
    bad = invoke("run", pkg, "-i", "x")
    assert bad.exit_code == errors.UsageError.exit_code and "NAME=FILE.npy" in bad.stderr
    missing = invoke("run", tmp_path / "nope.pkg")
    assert missing.exit_code == errors.UsageError.exit_code and "does not exist" in missing.stderr
    nan = np.ones((2, 4), np.float32)
    nan[1, 1] = np.nan
    dev = invoke("run", pkg, "-i", npy(tmp_path, "x", nan), "-i", npy(tmp_path, "scale", np.ones(2, np.float32)))
    assert dev.exit_code == errors.DeviceError.exit_code and "NaN at row 1" in dev.stderr


def test_run_never_unpickles(make_package, tmp_path: Path) -> None:
    obj = np.array([{"a": 1}], dtype=object)
    np.save(tmp_path / "x.npy", obj, allow_pickle=True)
    r = invoke("run", make_package(), "-i", f"x={tmp_path / 'x.npy'}")
    assert r.exit_code == errors.UsageError.exit_code and "cannot read" in r.stderr


def test_corrupt_and_incompatible_exit_codes(make_package, tmp_path: Path) -> None:
    pkg = make_package()
    flip(pkg, "cpu/x86-64-v2/model.so")
    r = invoke("run", pkg)
    assert r.exit_code == errors.PackageCorrupt.exit_code and "sha256" in r.stderr
    d = to_dict(affine_manifest())
    d["format_version"] = FORMAT_VERSION + 1
    r = invoke("verify", write_raw(tmp_path / "newer.pkg", d, {}))
    assert r.exit_code == errors.IncompatiblePackage.exit_code and "upgrade the runtime" in r.stderr


def _with_cuda(m: schema.Manifest, members: dict[str, bytes]) -> tuple[schema.Manifest, dict[str, bytes]]:
    k = schema.Kernel("affine_k", "cuda/sm_90/affine_k.cubin", (schema.Param("ptr", 8), schema.Param("global_scratch", 8)),
                      num_warps=4, shared=1024, source="cuda/sm_90/affine_k.py")  # fmt: skip
    launch = schema.Launch("affine_k", ("s0", 1, 1), (schema.Arg("ptr", buffer=schema.Ref("input", 0)),))
    t = schema.CudaTarget("sm_90", "3.6.0", "12.8", 12080, "fp32", 0, (), (k,), (launch,))
    blobs = {"cuda/sm_90/affine_k.cubin": b"\x7fELF", "cuda/sm_90/affine_k.py": b"import triton\n"}
    return dataclasses.replace(m, targets=(*m.targets, t)), {**members, **blobs}


def test_inspect_shows_cuda_kernels(make_package) -> None:
    r = invoke("inspect", make_package("cuda.pkg", edit=_with_cuda))
    assert r.exit_code == 0, r.output
    assert "target    cuda:sm_90  1 kernels, 1 launches" in r.stdout and "driver >= 12.8" in r.stdout
    row = next(ln for ln in r.stdout.splitlines() if ln.split()[:2] == ["affine_k", "cuda:sm_90"])
    assert "4 B" in row and "grid (batch, 1, 1), block 128, shared 1,024 B" in row, row
    assert "member    ok       cuda/sm_90/affine_k.cubin" in r.stdout


def test_verify_pass_and_fail(make_package) -> None:
    ok = invoke("verify", make_package())
    assert ok.exit_code == 0, ok.output
    assert "ok   y: max abs err" in ok.stdout and "ok   relu" in ok.stdout
    bad = invoke("verify", make_package("bad.pkg", defines=("SCALE=2",)))
    assert bad.exit_code == errors.VerifyFailed.exit_code == 8
    assert "FAIL y" in bad.stdout and "VerifyFailed: outputs y" in bad.stderr
    none = invoke("verify", make_package("none.pkg", selftest=False))
    assert none.exit_code == errors.UsageError.exit_code and "no self-test" in none.stderr


def test_inspect(make_package) -> None:
    pkg = make_package()
    r = invoke("inspect", pkg)
    assert r.exit_code == 0, r.output
    for line in (
        f"format    aotc format version {FORMAT_VERSION}",
        "model     affine",
        "dimension batch in [1, 64]",
        "input     x: float32[batch, 4]",
        "output    relu: float32[batch, 3]",
        "target    cpu:x86-64-v2  1 kernels in cpu/x86-64-v2/model.so, arena 12 B (batch=1) to 768 B (batch=64)",
        "weights   2 tensors, 60 bytes in weights.safetensors",
        "member    ok       weights.safetensors",
    ):
        assert line in r.stdout
    js = json.loads(invoke("inspect", pkg, "--json").stdout)
    assert js["manifest"]["format_version"] == FORMAT_VERSION and set(js["member_status"].values()) == {"ok"}
    flip(pkg, "weights.safetensors")
    r = invoke("inspect", pkg)
    assert r.exit_code == errors.PackageCorrupt.exit_code
    assert "member    MISMATCH weights.safetensors" in r.stdout and "ok       cpu/x86-64-v2/model.so" in r.stdout


def test_build_without_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.py"
    model.write_text("")
    monkeypatch.setitem(sys.modules, "aotc_build.build", None)
    r = invoke("build", model, "-o", tmp_path / "m.pkg")
    assert r.exit_code == errors.UsageError.exit_code and "pip install 'aotc[build]'" in r.stderr


def test_build_passes_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.py"
    model.write_text("")
    seen: dict[str, Any] = {}

    def fake_build(model_path, out_path, options, entry, inputs_entry, cache_dir=None, *rest, **kw):
        seen.update(model=model_path, out=out_path, options=options, entry=entry, inputs_entry=inputs_entry, cache=cache_dir)

    monkeypatch.setitem(sys.modules, "aotc_build.build", types.SimpleNamespace(build=fake_build))
    monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / "cache"))
    r = invoke(
        "build", model, "-o", tmp_path / "m.pkg", "--target", "cpu:x86-64-v3,cuda:sm_90", "--target", "sm_80",
        "--dynamic", "x:0:batch:1:64", "--precision", "bf16", "--no-selftest", "--entry", "net",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    opts = seen["options"]
    assert [str(t) for t in opts.targets] == ["cpu:x86-64-v3", "cuda:sm_90", "cuda:sm_80"]
    assert opts.dynamic == ("x:0:batch:1:64",) and opts.precision == "bf16" and not opts.selftest
    assert seen["entry"] == "net" and seen["inputs_entry"] is None and seen["out"] == tmp_path / "m.pkg"
    assert seen["cache"] == tmp_path / "cache"
    bad = invoke("build", model, "-o", tmp_path / "m.pkg", "--target", "tpu")
    assert bad.exit_code == errors.UsageError.exit_code and "unknown target" in bad.stderr


@pytest.mark.parametrize(
    ("native", "flags", "hinted"),
    [("x86-64-v4", [], True), ("x86-64-v4", ["--target", "cpu:x86-64-v3"], False), ("x86-64-v4", ["-q"], False),
     ("x86-64-v3", [], False)],
)  # fmt: skip
def test_build_notes_the_portable_default_below_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str, flags: list[str], hinted: bool
) -> None:
    """Without --target a package runs AVX2 code; on an AVX-512 machine the build says how to get its speed."""
    from aotc_build import cli_build

    model = tmp_path / "m.py"
    model.write_text("")

    def fake_build(model_path, out_path, options, *rest, **kw):
        return types.SimpleNamespace(kernels=1, targets=[str(t) for t in options.targets], seconds=None)

    monkeypatch.setitem(sys.modules, "aotc_build.build", types.SimpleNamespace(build=fake_build))
    monkeypatch.setattr(cli_build, "native_cpu_level", lambda: native)
    r = invoke("build", model, "-o", tmp_path / "m.pkg", *flags)
    assert r.exit_code == 0, r.output
    assert ("--target cpu:native" in r.stdout) is hinted, r.stdout
    if hinted:
        assert "built for cpu:x86-64-v3, the portable default; this machine runs x86-64-v4" in r.stdout


@pytest.mark.parametrize("name", sorted(errors.EXIT_CODES))
def test_every_error_class_maps_to_its_exit_code(name: str) -> None:
    cls = getattr(errors, name)

    @click.command()
    def boom() -> None:
        with cli_mod._errors():
            raise cls("the thing and the fix")

    r = CliRunner().invoke(boom, [])
    assert r.exit_code == cls.exit_code
    assert r.stderr.strip() == f"aotc: {name}: the thing and the fix"


def test_build_reports_kernels_and_stage_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aotc_cache: Path) -> None:
    monkeypatch.setenv("AOTC_CACHE_DIR", str(aotc_cache))
    example = Path(__file__).resolve().parents[1] / "examples" / "mlp.py"
    r = invoke("build", example, "-o", tmp_path / "mlp.pkg", "--target", "cpu:x86-64-v2")
    assert r.exit_code == 0, r.output
    wrote, timing = r.stdout.strip().splitlines()[-2:]
    assert wrote == f"wrote {tmp_path / 'mlp.pkg'} (3 kernels; targets cpu:x86-64-v2)"
    stages = [part.split()[0] for part in timing.split(": ", 1)[1].split(", ")]
    assert stages == ["capture", "lower", "passes", "fuse", "weights", "cpu:x86-64-v2", "selftest", "write"]
