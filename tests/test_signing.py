"""Package signatures (aotc.signing): keygen, sign, and refusals before anything of the package is read.

The package's library is built with -DMARK_LOAD (its constructor leaves a file): every refusal here must
come before any code of the package ran. docs/safety.md says what is signed and why.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="signatures need pip install 'aotc[sign]'")

import aotc
from aotc import signing
from aotc.package import Package, read_entries
from test_hostile import assert_refused, run_cli, run_many


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("keys")
    signing.keygen(work / "a.key")
    signing.keygen(work / "b.key")
    return {"a": work / "a.key", "a.pub": work / "a.key.pub", "b": work / "b.key", "b.pub": work / "b.key.pub"}


@pytest.fixture
def pkgs(make_package: Callable[..., Path], keys: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    unsigned = make_package("unsigned.pkg", defines=("MARK_LOAD",))
    signed = tmp_path / "signed.pkg"
    signing.sign(unsigned, keys["a"], signed)
    return {"unsigned": unsigned, "signed": signed}


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "loaded"
    monkeypatch.setenv("AOTC_TEST_LOADED", str(path))
    return path


def test_keygen_files(keys: dict[str, Path]) -> None:
    assert (keys["a"].stat().st_mode & 0o777) == 0o600
    assert b"BEGIN PRIVATE KEY" in keys["a"].read_bytes() and b"BEGIN PUBLIC KEY" in keys["a.pub"].read_bytes()
    with pytest.raises(aotc.UsageError, match="does not overwrite"):
        signing.keygen(keys["a"])


def test_signed_loads_with_its_key(pkgs: dict[str, Path], keys: dict[str, Path], marker: Path) -> None:
    with aotc.load(pkgs["signed"], device="cpu", trusted_keys=[keys["b.pub"], keys["a.pub"]]) as model:
        assert model.package.signer == signing.public_key(keys["a.pub"])
        assert all(c.ok for c in model.verify())
    assert marker.exists()
    with aotc.load(pkgs["signed"], device="cpu") as model:  # no keys: no check, signed or not
        assert model.package.signer is None


def test_signing_changes_only_the_comment(pkgs: dict[str, Path], keys: dict[str, Path], tmp_path: Path) -> None:
    """Members, offsets and hashes stay; the same key signs to the same bytes (ed25519 is deterministic);
    signing again replaces the signature."""
    raw, signed = pkgs["unsigned"].read_bytes(), pkgs["signed"].read_bytes()
    assert signed[: len(raw) - 2] == raw[:-2] and raw[-2:] == b"\0\0"
    again = tmp_path / "again.pkg"
    signing.sign(pkgs["signed"], keys["a"], again)
    assert again.read_bytes() == signed
    signing.sign(again, keys["b"])
    with Package(again, signing.public_keys([keys["b.pub"]])) as p:
        assert p.signer == signing.public_key(keys["b.pub"])
    with pytest.raises(aotc.UntrustedPackage, match="not a trusted key"):
        Package(again, signing.public_keys([keys["a.pub"]]))


def test_refused_with_another_key_or_unsigned(pkgs: dict[str, Path], keys: dict[str, Path], marker: Path) -> None:
    with pytest.raises(aotc.UntrustedPackage, match=r"signed by key [0-9a-f]{16}, which is not a trusted key"):
        aotc.load(pkgs["signed"], trusted_keys=[keys["b.pub"]])
    with pytest.raises(aotc.UntrustedPackage, match="is not signed"):
        aotc.load(pkgs["unsigned"], trusted_keys=[keys["a.pub"]])
    assert not marker.exists()


def _member_data(path: Path) -> list[tuple[int, int]]:
    return sorted((e.offset, e.offset + e.size) for e in read_entries(path.read_bytes(), path).values())


def test_any_changed_byte_is_refused(pkgs: dict[str, Path], keys: dict[str, Path], marker: Path, tmp_path: Path) -> None:
    """Every byte outside member data (ZIP headers, padding, central directory, end record, signature),
    every byte of the manifest, and a sample of every other member's bytes: each flip is refused, as
    UntrustedPackage or (a member's data, a ZIP record) PackageCorrupt, before any code ran."""
    signed = pkgs["signed"].read_bytes()
    data = _member_data(pkgs["signed"])
    e = read_entries(signed, pkgs["signed"])["manifest.json"]
    outside = [i for i in range(len(signed)) if not any(a <= i < b for a, b in data)]
    manifest = list(range(e.offset, e.offset + e.size))
    rng = random.Random(0)
    members = rng.sample([i for a, b in data if a != e.offset for i in range(a, b)], 400)
    trusted = [keys["a.pub"]]
    bad = tmp_path / "bad.pkg"
    kinds: dict[str, int] = {}
    for i in [*outside, *manifest, *members]:
        b = bytearray(signed)
        b[i] ^= 1 << rng.randrange(8)
        bad.write_bytes(b)
        with pytest.raises(aotc.AotcError) as err:
            aotc.load(bad, device="cpu", trusted_keys=trusted)
        assert isinstance(err.value, aotc.UntrustedPackage | aotc.PackageCorrupt), (i, err.value)
        kinds[type(err.value).__name__] = kinds.get(type(err.value).__name__, 0) + 1
    for cut in (1, 2, 50, len(signed) // 2):
        bad.write_bytes(signed[:-cut])
        with pytest.raises(aotc.AotcError):
            aotc.load(bad, device="cpu", trusted_keys=trusted)
    bad.write_bytes(signed + b"\0")
    with pytest.raises(aotc.AotcError):
        aotc.load(bad, device="cpu", trusted_keys=trusted)
    assert not marker.exists()
    assert kinds.get("UntrustedPackage", 0) > len(manifest)  # the manifest and the ZIP records


def test_rehashed_code_is_refused(pkgs: dict[str, Path], keys: dict[str, Path], marker: Path, tmp_path: Path) -> None:
    """The case hashes cannot catch: code replaced and the manifest's hash updated (docs/safety.md)."""
    from test_hostile import raw_parts, rehash, write_raw

    d, members = raw_parts(pkgs["signed"])
    so = next(n for n in members if n.endswith(".so"))
    members[so] = members[so] + b"\0"
    forged = write_raw(tmp_path / "forged.pkg", rehash(d, members), members)
    comment = pkgs["signed"].read_bytes()[-_comment_len(pkgs["signed"]) :]
    raw = bytearray(forged.read_bytes())  # the old signature copied onto the forged package
    raw[-2:] = struct.pack("<H", len(comment))
    forged.write_bytes(bytes(raw) + comment)
    with pytest.raises(aotc.UntrustedPackage, match="does not match the package"):
        aotc.load(forged, trusted_keys=[keys["a.pub"]])
    assert not marker.exists()


def _comment_len(path: Path) -> int:
    raw = path.read_bytes()
    pos = raw.rfind(b"PK\x05\x06")
    return struct.unpack_from("<H", raw, pos + 20)[0]


def test_malformed_signature_records(pkgs: dict[str, Path], keys: dict[str, Path], tmp_path: Path) -> None:
    raw = pkgs["unsigned"].read_bytes()[:-2]
    good = json.loads(pkgs["signed"].read_bytes()[-_comment_len(pkgs["signed"]) :][len(signing.MARK) :])
    records = [
        b"{", b"[]", b'{"algorithm": "rsa", "key": "", "signature": ""}', json.dumps({**good, "extra": 1}).encode(),
        json.dumps({**good, "key": good["key"][:-4]}).encode(), json.dumps({**good, "signature": "!!"}).encode(),
        b"[" * 30000,
    ]  # fmt: skip
    for body in records:
        comment = signing.MARK + body
        path = tmp_path / "m.pkg"
        path.write_bytes(raw + struct.pack("<H", len(comment)) + comment)
        with pytest.raises(aotc.UntrustedPackage, match="malformed"):
            Package(path, signing.public_keys([keys["a.pub"]]))
    path.write_bytes(raw + struct.pack("<H", 5) + b"hello")  # a plain ZIP comment: unsigned
    with pytest.raises(aotc.UntrustedPackage, match="is not signed"):
        Package(path, signing.public_keys([keys["a.pub"]]))


def test_api_misuse(pkgs: dict[str, Path], keys: dict[str, Path], tmp_path: Path) -> None:
    for bad, pattern in [
        (str(keys["a.pub"]), "is a list"),  # one path, not a list of them
        ([], "is empty"),
        ([keys["a"]], "that is a private key"),
        ([tmp_path / "missing.pub"], "cannot read"),
        ([tmp_path], "cannot read|not a regular file"),
        ([b"not a key"], "not a PEM public key"),
        ([42], "is a path"),
    ]:
        with pytest.raises(aotc.UsageError, match=pattern):
            aotc.load(pkgs["signed"], trusted_keys=bad)  # type: ignore[arg-type]
    raw = signing.public_key(keys["a.pub"]).raw
    assert aotc.load(pkgs["signed"], trusted_keys=[raw]).package.signer is not None  # 32 raw bytes
    with pytest.raises(aotc.UsageError, match="that is a public key"):
        signing.sign(pkgs["unsigned"], keys["a.pub"])
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)
    with pytest.raises(aotc.UsageError, match="not a regular file"):
        aotc.load(pkgs["signed"], trusted_keys=[fifo])


def test_openssl_keys_work(pkgs: dict[str, Path], tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl")
    key, pub = tmp_path / "o.key", tmp_path / "o.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    signing.sign(pkgs["unsigned"], key, tmp_path / "o.pkg")
    assert aotc.load(tmp_path / "o.pkg", trusted_keys=[pub]).package.signer is not None


def test_cli(pkgs: dict[str, Path], keys: dict[str, Path], tmp_path: Path) -> None:
    marker = tmp_path / "cli-loaded"
    signed, unsigned = str(pkgs["signed"]), str(pkgs["unsigned"])
    a, b = str(keys["a.pub"]), str(keys["b.pub"])
    tampered = tmp_path / "tampered.pkg"
    raw = bytearray(pkgs["signed"].read_bytes())
    at = raw.rfind(b'"signature":"') + 20  # inside the signature value, still valid base64
    raw[at] = ord("A") if raw[at] != ord("A") else ord("B")
    tampered.write_bytes(raw)
    corrupt = tmp_path / "corrupt.pkg"
    raw = bytearray(pkgs["unsigned"].read_bytes())
    raw[len(raw) // 2] ^= 1
    corrupt.write_bytes(raw)
    cases: list[tuple[list[str], int, str]] = [
        (["verify", signed, "--trusted-key", a], 0, ""),
        (["run", signed, "--trusted-key", b, "-i", "x=/nonexistent.npy"], 10, r"UntrustedPackage: .* not a trusted key"),
        (["verify", unsigned, "--trusted-key", a], 10, "UntrustedPackage: .* is not signed"),
        (["verify", unsigned, "--require-signature"], 2, "needs the keys to trust"),
        (["verify", str(tampered), "--trusted-key", a], 10, "does not match the package"),
        (["bench", signed, "--trusted-key", b, "-n", "1"], 10, "not a trusted key"),
        (["serve", unsigned, "--trusted-key", a, "--http-port", "0", "--grpc-port", "-1"], 10, "is not signed"),
        (["inspect", str(tampered)], 10, "INVALID"),
        (["inspect", unsigned, "--require-signature", "--trusted-key", a], 10, "is not signed"),
        (["sign", str(corrupt), "--key", str(keys["a"]), "-o", str(tmp_path / "x.pkg")], 3, "refusing to sign"),
        (["sign", unsigned, "--key", a], 2, "that is a public key"),
        (["keygen", str(keys["a"])], 2, "does not overwrite"),
    ]
    results = run_many([(args, marker) for args, _, _ in cases])
    for (args, code, pattern), r in zip(cases, results, strict=True):
        if code == 0:
            assert r.returncode == 0, (args, r.stderr)
        else:
            assert_refused(r, code, pattern)
    assert marker.exists()  # the first case ran the package: the marker works
    marker.unlink()
    results = run_many([(args, marker) for args, code, _ in cases if code])
    assert not marker.exists()

    ok = run_cli("inspect", signed, "--trusted-key", a)
    assert ok.returncode == 0 and f"signature: valid, ed25519, key {signing.public_key(keys['a.pub']).key_id} (a trusted key)" in ok.stdout
    none = run_cli("inspect", "--json", unsigned)
    assert none.returncode == 0 and json.loads(none.stdout)["signature"].startswith("none")
    env = {**os.environ, "AOTC_TRUSTED_KEYS": f"{b}{os.pathsep}{a}"}
    cmd = [sys.executable, "-m", "aotc", "verify", signed, "--require-signature"]
    assert subprocess.run(cmd, env=env, capture_output=True, check=False).returncode == 0
    env["AOTC_TRUSTED_KEYS"] = b
    assert subprocess.run(cmd, env=env, capture_output=True, check=False).returncode == 10
    out = tmp_path / "k"
    r = run_cli("keygen", str(out))
    assert r.returncode == 0 and "key id" in r.stdout
    r = run_cli("sign", unsigned, "--key", str(out), "-o", str(tmp_path / "s.pkg"))
    assert r.returncode == 0, r.stderr
    assert run_cli("verify", str(tmp_path / "s.pkg"), "--trusted-key", f"{out}.pub").returncode == 0


def test_fuzzed_signed_packages_are_refused(pkgs: dict[str, Path], keys: dict[str, Path]) -> None:
    """Every mutation of a signed package (tests/fuzz_packages.py) is refused when its key is required."""
    n = os.environ.get("AOTC_FUZZ_CASES", "100")
    fuzz = Path(__file__).with_name("fuzz_packages.py")
    cmd = [sys.executable, str(fuzz), str(pkgs["signed"]), n, "5", "--trusted-key", str(keys["a.pub"])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600 + 2 * int(n), check=False)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    summary = json.loads(r.stdout.splitlines()[0])
    assert set(summary["exit_codes"]) <= {"3", "10"}, summary


def test_docs_sequence_parses() -> None:
    """docs/sign.md shows the whole sequence as plain lines (tests/test_docs.py runs console lines on
    several workers, in any order; test_cli above runs the same steps in order)."""
    import shlex

    import click
    from aotc.cli import cli

    text = (Path(__file__).resolve().parents[1] / "docs" / "sign.md").read_text()
    lines = [ln.strip().split("  #")[0] for ln in text.splitlines() if ln.startswith("    aotc ")]
    assert len(lines) == 5
    for line in lines:
        args = shlex.split(line)[1:]
        cmd = cli.get_command(click.Context(cli), args[0])
        assert cmd is not None
        cmd.make_context(args[0], args[1:])
