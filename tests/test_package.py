"""The package format and container: manifest round trip and validation, the ZIP writer's layout
(deterministic, aligned, readable by standard tools), and the reader's refusals."""

from __future__ import annotations

import dataclasses
import json
import mmap
import subprocess
import sys
import zipfile
from pathlib import Path

import aotc.container
import aotc.package as rpkg
import aotc_build.package as wpkg
import numpy as np
import pytest
from affine_pkg import B, W, affine_manifest
from aotc.errors import IncompatiblePackage, PackageCorrupt, UsageError
from aotc.package import ALIGN, Package, read_entries
from aotc.schema import (
    FORMAT_VERSION,
    CudaTarget,
    Symbol,
    TensorSpec,
    from_json,
    to_dict,
    to_json,
)
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save


def write_raw(path: Path, manifest: dict | str, members: dict[str, bytes]) -> Path:
    """A package with an arbitrary manifest, bypassing write_package's validation."""
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    files = [("manifest.json", text.encode()), *sorted(members.items())]
    wpkg._write_atomic(path, wpkg._layout(files))
    return path


def raw_parts(path: Path) -> tuple[dict, dict[str, bytes]]:
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        return manifest, {n: z.read(n) for n in z.namelist() if n != "manifest.json"}


def flip(path: Path, member: str, offset: int = 100) -> None:
    """Flip one byte of a member's data in place."""
    data = bytearray(path.read_bytes())
    e = read_entries(bytes(data), path)[member]
    data[e.offset + min(offset, e.size - 1)] ^= 0x01
    path.write_bytes(bytes(data))


# ---- manifest ------------------------------------------------------------------------------------------


def test_manifest_round_trip() -> None:
    m = dataclasses.replace(
        affine_manifest(),
        targets=(
            *affine_manifest().targets,
            CudaTarget("sm_90", "3.6.0", "12.8", 12080, "bf16", "s0*64", (), (), ()),
        ),
    )
    text = to_json(m)
    again = from_json(text)
    assert again == m
    assert to_json(again) == text
    assert json.loads(text)["format"] == "aotc"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("inputs", 0, "dtype"), "float33", "inputs[0].dtype"),
        (("inputs", 1, "shape", 0), "s0 +* 2", "inputs[1].shape[0]"),
        (("inputs", 0, "shape", 1), -4, "inputs[0].shape[1]"),
        (("symbols", 0, "min"), "1", "symbols[0].min"),
        (("targets", 0, "abi_version"), None, "targets[0].abi_version"),
        (("outputs", 0, "shape", 0), "s7", "outputs[0].shape[0]"),
        (("weights", "member"), "../weights.safetensors", "weights.member"),
        (("targets", 0, "kind"), "tpu", "targets[0].kind"),
        (("model", "color"), "blue", "model.color"),
        (("targets", 0, "min_glibc"), "2.x", "targets[0].min_glibc"),
        (("targets", 0, "min_glibc"), 236, "targets[0].min_glibc"),
    ],
)
def test_manifest_field_errors_name_the_field(path: tuple, value: object, field: str) -> None:
    d = to_dict(affine_manifest())
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    with pytest.raises(PackageCorrupt, match=field.replace("[", r"\[").replace("]", r"\]")):
        from_json(json.dumps(d))


def test_symbol_must_be_bindable() -> None:
    m = dataclasses.replace(affine_manifest(), symbols=(*affine_manifest().symbols, Symbol("s1", "seq", 1, 8)))
    with pytest.raises(PackageCorrupt, match="s1.*seq.*not a plain dimension"):
        to_json(m)


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 1, 0])
def test_other_format_version_is_incompatible(tmp_path: Path, version: int) -> None:
    d = to_dict(affine_manifest())
    d["format_version"] = version
    d["something_new"] = True  # fields of other versions are not even looked at
    path = write_raw(tmp_path / "v.pkg", d, {})
    fix = "upgrade the runtime" if version > FORMAT_VERSION else "rebuild the package"
    with pytest.raises(IncompatiblePackage, match=f"format version {version}.*reads format version {FORMAT_VERSION}.*{fix}"):
        Package(path)


def test_not_an_aotc_manifest(tmp_path: Path) -> None:
    with pytest.raises(PackageCorrupt, match="not an aotc package"):
        Package(write_raw(tmp_path / "x.pkg", {"format": "onnx"}, {}))
    with pytest.raises(PackageCorrupt, match="not valid JSON"):
        Package(write_raw(tmp_path / "y.pkg", "{nope", {}))


# ---- writer ------------------------------------------------------------------------------------------------


def test_writes_are_byte_identical_aligned_and_standard(make_package) -> None:
    a = make_package("a.pkg").read_bytes()
    b = make_package("b.pkg").read_bytes()
    assert a == b
    entries = read_entries(a, Path("a.pkg"))
    assert list(entries) == sorted(entries, key=lambda n: (n != "manifest.json", n))
    assert all(e.offset % ALIGN == 0 for e in entries.values())
    with zipfile.ZipFile(make_package("c.pkg")) as z:
        assert z.testzip() is None
        assert all(i.compress_type == zipfile.ZIP_STORED and i.date_time == (1980, 1, 1, 0, 0, 0) for i in z.infolist())
        weights = st_load(z.read("weights.safetensors"))  # the safetensors library reads our layout
        np.testing.assert_array_equal(weights["W"], W)


def test_write_is_atomic_and_refuses_bad_input(tmp_path: Path) -> None:
    m = affine_manifest()
    _, wblob = wpkg.weights_member([("W", W), ("b", B)])
    out = tmp_path / "p.pkg"
    with pytest.raises(PackageCorrupt, match="not given.*model.so"):
        wpkg.write_package(out, m, {"weights.safetensors": wblob})
    with pytest.raises(PackageCorrupt, match="unsafe"):
        wpkg.write_package(out, m, {"weights.safetensors": wblob, "../x": b""})
    bad = dataclasses.replace(m, inputs=(TensorSpec("x", "complex64", (4,)),))
    with pytest.raises(PackageCorrupt, match=r"inputs\[0\].dtype"):
        wpkg.write_package(out, bad, {"weights.safetensors": wblob, "cpu/x86-64-v2/model.so": b"\x7fELF"})
    assert list(tmp_path.iterdir()) == []  # nothing written, no temp file left behind


def test_zip64_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lower the 4 GiB threshold on both sides so the zip64 paths run on a small file."""
    monkeypatch.setattr(wpkg, "MAX32", 200)
    monkeypatch.setattr(aotc.container, "MAX32", 200)  # the reader: aotc.container (Package reads through it)
    members = {"big.bin": bytes(range(256)) * 3, "small.bin": b"abc"}
    path = write_raw(tmp_path / "z.pkg", {"format": "aotc"}, members)
    entries = read_entries(path.read_bytes(), path)
    data = path.read_bytes()
    for name, blob in members.items():
        e = entries[name]
        assert data[e.offset : e.offset + e.size] == blob and e.offset % ALIGN == 0


# ---- reader ----------------------------------------------------------------------------------------------


def test_weights_are_zero_copy_aligned_views(make_package) -> None:
    pkg = Package(make_package())
    w, b = pkg.weights()
    np.testing.assert_array_equal(w, W)
    np.testing.assert_array_equal(b, B)
    for arr in (w, b):
        assert arr.ctypes.data % 64 == 0 and not arr.flags.writeable
        base = arr
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def test_weights_from_the_safetensors_library(make_package) -> None:
    """A blob written by safetensors itself (no aotc alignment) still loads, as aligned copies."""

    def edit(m, members):
        members["weights.safetensors"] = st_save({"W": W, "b": B})
        return m, members

    w, b = Package(make_package(edit=edit)).weights()
    np.testing.assert_array_equal(w, W)
    np.testing.assert_array_equal(b, B)
    assert w.ctypes.data % 64 == 0 and b.ctypes.data % 64 == 0


def test_bfloat16_weights(make_package) -> None:
    import ml_dtypes

    h = (np.arange(6, dtype=np.float32) / 3).astype(ml_dtypes.bfloat16).reshape(2, 3)

    def edit(m, members):
        weights, blob = wpkg.weights_member([("W", W), ("b", B), ("h", h)])
        members["weights.safetensors"] = blob
        return dataclasses.replace(m, weights=weights), members

    *_, got = Package(make_package(edit=edit)).weights()
    assert got.dtype == h.dtype
    np.testing.assert_array_equal(got, h)


def test_weight_disagreeing_with_manifest(make_package) -> None:
    def edit(m, members):
        tensors = (TensorSpec("W", "float32", (3, 4)), m.weights.tensors[1])
        return dataclasses.replace(m, weights=dataclasses.replace(m.weights, tensors=tensors)), members

    with pytest.raises(PackageCorrupt, match=r"weight 'W' is float32\[4, 3\].*manifest says float32\[3, 4\]"):
        Package(make_package(edit=edit)).weights()


def test_flipped_weight_byte_is_caught_before_parsing(make_package, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_package()
    flip(path, "weights.safetensors", offset=200)
    parsed = []
    monkeypatch.setattr(rpkg, "parse_safetensors", lambda *a: parsed.append(a))
    pkg = Package(path)  # structure is fine; the hash is checked when the member is used
    with pytest.raises(PackageCorrupt, match="weights.safetensors.*sha256"):
        pkg.weights()
    assert parsed == []
    assert not pkg.check("weights.safetensors") and pkg.check("cpu/x86-64-v2/model.so")


def test_truncated_and_non_packages(make_package, tmp_path: Path) -> None:
    path = make_package()
    data = path.read_bytes()
    for n in (len(data) - 1, len(data) // 2, 30):
        (tmp_path / "t.pkg").write_bytes(data[:n])
        with pytest.raises(PackageCorrupt, match="truncated|too short"):
            Package(tmp_path / "t.pkg")
    (tmp_path / "e.pkg").write_bytes(b"")
    with pytest.raises(PackageCorrupt, match="empty"):
        Package(tmp_path / "e.pkg")
    (tmp_path / "j.pkg").write_bytes(b"not a zip at all" * 10)
    with pytest.raises(PackageCorrupt, match="not a package"):
        Package(tmp_path / "j.pkg")
    with pytest.raises(UsageError, match="does not exist"):
        Package(tmp_path / "missing.pkg")


def test_manifest_crc_catches_a_flipped_digit(make_package) -> None:
    path = make_package()
    data = bytearray(path.read_bytes())
    e = read_entries(bytes(data), path)["manifest.json"]
    pos = data.index(b'"max": 64', e.offset)
    data[pos + 7 : pos + 9] = b"99"
    path.write_bytes(bytes(data))
    with pytest.raises(PackageCorrupt, match="CRC-32"):
        Package(path)


def test_members_must_match_the_manifest(make_package, tmp_path: Path) -> None:
    manifest, members = raw_parts(make_package())
    with pytest.raises(PackageCorrupt, match="'extra.bin' is not listed"):
        Package(write_raw(tmp_path / "a.pkg", manifest, {**members, "extra.bin": b"x"}))
    del members["selftest.safetensors"]
    with pytest.raises(PackageCorrupt, match="'selftest.safetensors' is listed in the manifest but missing"):
        Package(write_raw(tmp_path / "b.pkg", manifest, members))
    manifest, members = raw_parts(make_package())
    members["weights.safetensors"] += b"\0"
    with pytest.raises(PackageCorrupt, match="is 397 bytes, the manifest says 396|bytes, the manifest says"):
        Package(write_raw(tmp_path / "c.pkg", manifest, members))


@pytest.mark.parametrize("name", ["../evil.so", "/etc/evil", "cpu/./x.so", "a\\b"])
def test_path_traversal_names_are_refused(tmp_path: Path, name: str) -> None:
    path = write_raw(tmp_path / "p.pkg", {"format": "aotc"}, {name: b"x"})
    with pytest.raises(PackageCorrupt, match="unsafe member name"):
        Package(path)


def test_safetensors_header_checks() -> None:
    good = wpkg.encode_tensors([("a", np.ones(3, np.float32))])
    assert set(rpkg.parse_safetensors(memoryview(good), "m")) == {"a"}
    hdr = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}).encode()
    blob = len(hdr).to_bytes(8, "little") + hdr + bytes(12)
    with pytest.raises(PackageCorrupt, match=r"disagree with float32\[4\]"):
        rpkg.parse_safetensors(memoryview(blob), "m")
    hdr = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}).encode()
    blob = len(hdr).to_bytes(8, "little") + hdr + bytes(8)
    with pytest.raises(PackageCorrupt, match="overlap or hole"):
        rpkg.parse_safetensors(memoryview(blob), "m")
    with pytest.raises(PackageCorrupt, match="header length"):
        rpkg.parse_safetensors(memoryview((10**9).to_bytes(8, "little") + b"{}"), "m")


def test_encoded_tensors_read_back_by_safetensors_and_aligned() -> None:
    """Strided, zero-size, 0-d, bool and bf16 tensors: each lands whole, in order, on a 64-byte boundary."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    named = [
        ("t", rng.standard_normal((5, 7), dtype=np.float32).T),  # not contiguous
        ("empty", np.zeros((0, 3), np.int64)),
        ("scalar", np.array(2.5, np.float64)),
        ("mask", rng.random(9) > 0.5),
        ("half", rng.standard_normal(11).astype(ml_dtypes.bfloat16)),
        ("ids", rng.integers(-9, 9, (3, 1, 2)).astype(np.int8)),
    ]
    blob = wpkg.encode_tensors(named)
    header_end = 8 + int.from_bytes(blob[:8], "little")
    meta = json.loads(blob[8:header_end])
    assert [k for k in meta if k != "__metadata__" and not k.startswith(wpkg.PAD_PREFIX)] == [n for n, _ in named]
    for name, arr in named:
        lo, hi = meta[name]["data_offsets"]
        assert (header_end + lo) % ALIGN == 0 and blob[header_end + lo : header_end + hi] == np.ascontiguousarray(arr).tobytes()
    plain = [(n, a) for n, a in named if n != "half"]  # the safetensors library's numpy side has no bf16
    back = st_load(wpkg.encode_tensors(plain))
    for name, arr in plain:
        np.testing.assert_array_equal(back[name], arr)


def test_cold_start_imports_stay_light(make_package) -> None:
    """A fresh process loads and runs a package with the format's records made by aotc.records (no methods
    compiled at import: ~40 ms of a cold start with dataclasses)."""
    code = (
        "import sys, dataclasses, numpy as np, aotc\n"
        "m = aotc.load(sys.argv[1], device='cpu')\n"
        "y, _ = m(np.ones((3, 4), np.float32), np.ones(3, np.float32))\n"
        "import aotc.package, aotc.schema\n"
        "records = [c for mod in (aotc.package, aotc.schema) for c in vars(mod).values() if dataclasses.is_dataclass(c)]\n"
        "compiled = [c.__name__ for c in records if not c.__eq__.__code__.co_filename.endswith('records.py')]\n"
        "print(len(records) > 10, compiled)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(make_package())], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True []"
