"""The Python API beside onnxruntime.InferenceSession's: outputs by name, an output selection, threads set
after load, explicit casts (``Model.cast``, ``--cast`` at the CLI), and what the builder records about the
shape of forward()'s result (``manifest.model.returns``)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import aotc
import ml_dtypes
import numpy as np
import pytest
from affine_pkg import reference
from aotc.errors import InputMismatch, UsageError
from aotc.schema import Manifest, TensorSpec


def _inputs(n: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    return rng.standard_normal((n, 4)).astype(np.float32), rng.standard_normal(n).astype(np.float32)


def _returns_dict(m: Manifest, members: dict[str, bytes]) -> tuple[Manifest, dict[str, bytes]]:
    return dataclasses.replace(m, model=dataclasses.replace(m.model, returns="dict")), members


def test_call_returns_a_dict_when_the_model_did(make_package) -> None:
    x, s = _inputs()
    y, relu = reference(x, s)
    with aotc.load(make_package("t.pkg")) as model:  # forward() returned a tuple
        got = model(x, s)
        assert isinstance(got, tuple) and len(got) == 2
    with aotc.load(make_package("d.pkg", edit=_returns_dict)) as model:
        got = model(x, s)
        assert isinstance(got, dict) and list(got) == ["y", "relu"]
        np.testing.assert_allclose(got["relu"], relu, rtol=1e-5, atol=1e-6)
        assert model.input_names == ["x", "scale"] and model.output_names == ["y", "relu"]


def test_output_names_selects_and_orders(make_package) -> None:
    x, s = _inputs()
    y, relu = reference(x, s)
    with aotc.load(make_package()) as model:
        got = model.run({"x": x, "scale": s}, output_names=["relu", "y"])
        assert list(got) == ["relu", "y"]
        np.testing.assert_allclose(got["y"], y, rtol=1e-5, atol=1e-6)
        assert list(model.run({"x": x, "scale": s}, output_names=["relu"])) == ["relu"]
        with pytest.raises(UsageError, match="unknown output 'z'.*y, relu"):
            model.run({"x": x, "scale": s}, output_names=["z"])
        with pytest.raises(UsageError, match="list of output names"):
            model.run({"x": x, "scale": s}, output_names="y")


class _Spy:
    """Records what the runtime hands the library's thread setting, and passes every call through."""

    def __init__(self, lib: Any) -> None:
        self.lib, self.counts = lib, []

    def aotc_set_num_threads(self, n: int) -> None:
        self.counts.append(int(n))
        self.lib.aotc_set_num_threads(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lib, name)


def test_threads_settable_after_load(make_package) -> None:
    x, s = _inputs(40)
    with aotc.load(make_package()) as model:
        assert model.num_threads is None
        spy = _Spy(model.executor._lib)  # type: ignore[attr-defined]
        model.executor._lib = spy  # type: ignore[attr-defined]
        model.num_threads = 1
        assert model.num_threads == 1
        np.testing.assert_allclose(model(x, s)[0], reference(x, s)[0], rtol=1e-5, atol=1e-6)
        model.num_threads = None
        model(x, s)
        assert spy.counts[-2:] == [1, 0]
        for bad in (-1, 1.5, True, "2"):
            with pytest.raises(UsageError, match="num_threads"):
                model.num_threads = bad  # type: ignore[assignment]


def _bf16_input(m: Manifest, members: dict[str, bytes]) -> tuple[Manifest, dict[str, bytes]]:
    """The affine package claiming a bfloat16 'scale' (for the dtype checks only: nothing runs it)."""
    scale = TensorSpec("scale", "bfloat16", ("s0",))
    return dataclasses.replace(m, inputs=(m.inputs[0], scale)), members


def test_cast_is_explicit(make_package) -> None:
    with aotc.load(make_package("b.pkg", edit=_bf16_input, selftest=False, relink=True)) as model:
        x, s = _inputs()
        with pytest.raises(InputMismatch, match=r"got dtype float32, expected bfloat16.*astype\(ml_dtypes.bfloat16\)"):
            model.run({"x": x, "scale": s})
        cast = model.cast({"x": x, "scale": s})
        assert cast["scale"].dtype == ml_dtypes.bfloat16 and cast["x"] is x
        np.testing.assert_array_equal(cast["scale"], s.astype(ml_dtypes.bfloat16))
        with pytest.raises(InputMismatch, match="cannot cast int64 to bfloat16"):
            model.cast({"x": x, "scale": np.arange(5)})


def _aotc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aotc", *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_cli_cast_flag(make_package, tmp_path: Path) -> None:
    pkg = make_package("b.pkg", edit=_bf16_input, selftest=False, relink=True)
    x, s = _inputs()
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "s.npy", s)
    args = ("--input", "x=x.npy", "--input", "scale=s.npy")
    for cmd in (("run", str(pkg), *args), ("bench", str(pkg), *args, "-n", "2", "--warmup", "0")):
        r = _aotc(*cmd, cwd=tmp_path)
        assert r.returncode == 5, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        assert "holds float32, the package takes bfloat16" in r.stderr and "--cast" in r.stderr
    r = _aotc("run", str(pkg), *args, "--cast", "--output", "out.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "out.npz")
    # the library reads 'scale' as float32, whatever the manifest claims: only the cast itself is checked here
    assert set(out.files) == {"y", "relu"}


def test_builder_records_how_forward_returned(tmp_path: Path, aotc_cache: Path) -> None:
    """A dict and a dataclass come back by name; a tuple by position."""
    from aotc_build.build import build
    from aotc_build.options import BuildOptions, Target

    src = tmp_path / "m.py"
    src.write_text(
        "import dataclasses, torch\n"
        "@dataclasses.dataclass\n"
        "class Out:\n    logits: torch.Tensor\n    probs: torch.Tensor\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n        return Out(x * 2, torch.softmax(x, -1))\n"
        "class D(torch.nn.Module):\n"
        "    def forward(self, x):\n        return {'logits': x * 2, 'probs': torch.softmax(x, -1)}\n"
        "class T(torch.nn.Module):\n"
        "    def forward(self, x):\n        return x * 2, torch.softmax(x, -1)\n"
        "dataclass_model, dict_model, tuple_model = M(), D(), T()\n"
        "example_inputs = (torch.randn(2, 8),)\n"
    )
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    for entry, returns in (("dataclass_model", "dict"), ("dict_model", "dict"), ("tuple_model", "tuple")):
        out = tmp_path / f"{entry}.pkg"
        build(src, out, BuildOptions(targets=(Target("cpu", "x86-64-v3"),)), entry=entry, cache_dir=aotc_cache)
        with aotc.load(out) as model:
            assert model.manifest.model.returns == returns
            got = model(x)
            logits = got["logits"] if returns == "dict" else got[0]
            np.testing.assert_allclose(logits, x * 2, rtol=1e-6)
            if returns == "dict":
                assert list(got) == ["logits", "probs"]


def test_cli_cast_on_a_bf16_package(tmp_path: Path, aotc_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real --precision bf16 build: float32 data is refused naming --cast, and with it runs and matches
    the Python API's explicit cast."""
    from aotc.cli import cli
    from click.testing import CliRunner

    monkeypatch.setenv("AOTC_CACHE_DIR", str(aotc_cache))
    monkeypatch.chdir(tmp_path)
    mlp = str(Path(__file__).resolve().parents[1] / "examples" / "mlp.py")
    r = CliRunner().invoke(cli, ["build", mlp, "-o", "bf16.pkg", "--precision", "bf16", "--quiet"])
    assert r.exit_code == 0, r.output
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    np.save("x.npy", x)
    r = CliRunner().invoke(cli, ["run", "bf16.pkg", "-i", "x=x.npy"])
    assert r.exit_code == 5 and "the file holds float32, the package takes bfloat16" in r.stderr and "--cast" in r.stderr
    r = CliRunner().invoke(cli, ["run", "bf16.pkg", "-i", "x=x.npy", "--cast", "-o", "out.npz"])
    assert r.exit_code == 0, r.output
    with aotc.load("bf16.pkg") as model:
        want = model.run(model.cast({"x": x}))["output0"]
    got = np.load("out.npz")["output0"]  # bfloat16 stored as raw 2-byte values
    np.testing.assert_array_equal(got.view(ml_dtypes.bfloat16), want)
    r = CliRunner().invoke(cli, ["bench", "bf16.pkg", "-i", "x=x.npy", "--cast", "-n", "3", "--warmup", "0"])
    assert r.exit_code == 0 and "x: bfloat16[4, 256]" in r.stdout, r.output
