"""Writing a package: one uncompressed, 64-byte-aligned ZIP holding ``manifest.json`` and the members.

What it is: ``write_package`` (hashes every member into the manifest, lays the ZIP out deterministically and
writes it atomically) and ``encode_tensors`` (a safetensors blob whose tensors all start on 64-byte
boundaries, so the runtime maps weights in place). The format itself is defined in ``aotc.schema``; the
record layouts are shared with the reader in ``aotc.package``.
What it is not: a general ZIP writer. Members are stored, never compressed; names are ASCII; timestamps are
fixed at 1980-01-01 so that equal inputs give byte-identical packages.

Note: alignment works like Android's zipalign: the local header of each member gets an extra record
(id 0xD935) whose length pads the member's data to the next 64-byte boundary. ZIP readers skip it.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import secrets
import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from aotc.container import (
    ALIGN,
    ALIGN_EXTRA,
    CENTRAL,
    CENTRAL_SIG,
    EOCD,
    EOCD64,
    EOCD64_SIG,
    EOCD_SIG,
    LOCAL,
    LOCAL_SIG,
    LOCATOR64,
    LOCATOR64_SIG,
    MAX32,
)
from aotc.errors import PackageCorrupt
from aotc.package import PAD_PREFIX, ST_DTYPES
from aotc.schema import (
    HASH_CHUNK,
    MANIFEST,
    Manifest,
    Member,
    SelfTest,
    TensorSpec,
    Weights,
    check_member_name,
    dtype_name,
    to_json,
)

_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01, the earliest a ZIP can say
_DOS_TIME = 0
_UNIX_FILE = 0o100644 << 16
_MADE_BY = (3 << 8) | 45  # Unix, spec 4.5 (zip64)


def _zip64_extra(values: Sequence[int]) -> bytes:
    return struct.pack(f"<HH{len(values)}Q", 0x0001, 8 * len(values), *values) if values else b""


def _layout(files: Sequence[tuple[str, bytes | memoryview]]) -> list[bytes | memoryview]:
    """The ZIP as a list of chunks: local headers with data, the central directory, the end records."""
    chunks: list[bytes | memoryview] = []
    central: list[bytes] = []
    pos = 0
    for name, data in files:
        raw = name.encode("ascii")
        size, crc = len(data), zlib.crc32(data)
        big = size >= MAX32
        extra = _zip64_extra([size, size]) if big else b""
        pad = -(pos + LOCAL.size + len(raw) + len(extra)) % ALIGN
        if pad and pad < 6:  # the padding record needs 4 bytes of header and 2 of alignment value
            pad += ALIGN
        if pad:
            extra += struct.pack("<HHH", ALIGN_EXTRA, pad - 4, ALIGN) + bytes(pad - 6)
        field = MAX32 if big else size
        local = LOCAL.pack(LOCAL_SIG, 45 if big else 20, 0, 0, _DOS_TIME, _DOS_DATE, crc, field, field, len(raw), len(extra))
        head = local + raw + extra
        assert (pos + len(head)) % ALIGN == 0
        chunks += [head, data]
        c64 = [size, size] if big else []
        if pos >= MAX32:
            c64.append(pos)
        cx = _zip64_extra(c64)
        central.append(
            CENTRAL.pack(
                CENTRAL_SIG,
                _MADE_BY,
                45 if cx else 20,
                0,
                0,
                _DOS_TIME,
                _DOS_DATE,
                crc,
                field,
                field,
                len(raw),
                len(cx),
                0,
                0,
                0,
                _UNIX_FILE,
                MAX32 if pos >= MAX32 else pos,
            )  # fmt: skip
            + raw
            + cx
        )
        pos += len(head) + size
    cd = b"".join(central)
    n = len(files)
    if pos + len(cd) >= MAX32 or n >= 0xFFFF:
        tail = EOCD64.pack(EOCD64_SIG, EOCD64.size - 12, _MADE_BY, 45, 0, 0, n, n, len(cd), pos)
        tail += LOCATOR64.pack(LOCATOR64_SIG, 0, pos + len(cd), 1)
        tail += EOCD.pack(EOCD_SIG, 0, 0, 0xFFFF, 0xFFFF, MAX32, MAX32, 0)
    else:
        tail = EOCD.pack(EOCD_SIG, 0, 0, n, n, len(cd), pos, 0)
    return [*chunks, cd, tail]


def write_package(path: str | Path, manifest: Manifest, members: Mapping[str, bytes | memoryview]) -> Manifest:
    """Write ``manifest`` and ``members`` to ``path`` atomically; return the manifest with members filled.

    ``manifest.members`` is ignored and replaced by the sha256 and size of every entry of ``members``
    (manifest.json excepted: it cannot hash itself). Raises PackageCorrupt naming the field when the
    manifest is invalid or references a member that is not given; nothing is written then.
    """
    for name in members:
        check_member_name(name)
    filled = dataclasses.replace(manifest, members={n: member_hashes(members[n]) for n in sorted(members)})
    missing = [m for m in filled.referenced_members() if m not in members]
    if missing:
        raise PackageCorrupt(f"refusing to write {path}: the manifest refers to members not given: {missing}")
    try:
        text = to_json(filled)
    except PackageCorrupt as e:
        raise PackageCorrupt(f"refusing to write {path}: invalid manifest: {e}") from None
    files = [(MANIFEST, text.encode("ascii")), *((n, members[n]) for n in sorted(members))]
    _write_atomic(Path(path), _layout(files))
    return filled


def member_hashes(data: bytes | memoryview) -> Member:
    """A member's sha256, size, and (past HASH_CHUNK bytes) the sha256 of each chunk, which the runtime
    checks on several threads at once."""
    view = memoryview(data)
    chunks: tuple[str, ...] = ()
    if len(view) > HASH_CHUNK:
        chunks = tuple(hashlib.sha256(view[i : i + HASH_CHUNK]).hexdigest() for i in range(0, len(view), HASH_CHUNK))
    return Member(hashlib.sha256(view).hexdigest(), len(view), chunks)


def _clean_stale(path: Path) -> None:
    """Remove temporary files that a killed earlier write to ``path`` left (their writer's pid is dead)."""
    for old in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = old.name[len(path.name) + 2 :].split(".")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            old.unlink(missing_ok=True)
        except OSError:
            pass  # alive, or another user's: leave it


def _write_atomic(path: Path, chunks: Sequence[bytes | memoryview]) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it: readers see all or nothing.
    The temporary name holds the writer's pid, so the next write cleans what a killed one left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)  # make the rename itself durable
    except OSError:
        pass
    finally:
        os.close(dfd)


# ---- tensors ---------------------------------------------------------------------------------------------


def tensor_spec(name: str, arr: np.ndarray) -> TensorSpec:
    dt = dtype_name(arr.dtype)
    if dt is None:
        raise ValueError(f"tensor {name!r} has dtype {arr.dtype}, which packages cannot hold")
    return TensorSpec(name, dt, tuple(int(d) for d in arr.shape))


def encode_tensors(named: Sequence[tuple[str, np.ndarray]]) -> bytes:
    """A safetensors blob (readable by the ``safetensors`` library) with the tensors in the given order and
    each one's data on a 64-byte boundary when the blob itself starts on one (as package members do).

    safetensors forbids holes between tensors, so alignment gaps are filled with small uint8 tensors
    named ``__aotc_pad_N``; the runtime checks and skips them.
    """
    specs = [tensor_spec(n, a) for n, a in named]
    if len({s.name for s in specs}) != len(specs) or any(s.name.startswith(PAD_PREFIX) for s in specs):
        raise ValueError("tensor names must be unique and must not start with " + PAD_PREFIX)
    # Offsets are relative to the data start, which the space-padded header puts on a 64-byte boundary.
    hdr: dict[str, object] = {"__metadata__": {"format": "aotc"}}
    places: list[tuple[int, np.ndarray]] = []
    pos = 0
    for k, (spec, (_, arr)) in enumerate(zip(specs, named, strict=True)):
        gap = -pos % ALIGN
        if gap:
            hdr[f"{PAD_PREFIX}{k}"] = {"dtype": "U8", "shape": [gap], "data_offsets": [pos, pos + gap]}
            pos += gap
        hdr[spec.name] = {"dtype": ST_DTYPES[spec.dtype], "shape": list(spec.shape), "data_offsets": [pos, pos + arr.nbytes]}
        places.append((pos, arr))
        pos += arr.nbytes
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)
    head = struct.pack("<Q", len(text)) + text
    # one copy of each tensor, straight into place (weights run to gigabytes); gaps stay zero
    out = bytearray(len(head) + pos)
    out[: len(head)] = head
    for at, arr in places:
        if not arr.nbytes:
            continue
        start = len(head) + at
        np.copyto(np.frombuffer(out, np.uint8, arr.nbytes, start).view(arr.dtype).reshape(arr.shape), arr)
    return bytes(out)


def weights_member(named: Sequence[tuple[str, np.ndarray]], member: str = "weights.safetensors") -> tuple[Weights, bytes]:
    """The manifest's weights section and its member; ``named`` order becomes the ABI order."""
    return Weights(member, tuple(tensor_spec(n, a) for n, a in named)), encode_tensors(named)


def selftest_member(
    inputs: Sequence[tuple[str, np.ndarray]],
    outputs: Sequence[tuple[str, np.ndarray]],
    rtol: float,
    atol: float,
    member: str = "selftest.safetensors",
) -> tuple[SelfTest, bytes]:
    """The self-test section and its member: example inputs and eager outputs keyed ``input.NAME`` and
    ``output.NAME`` (given in manifest input and output order)."""
    named = [(f"input.{n}", a) for n, a in inputs] + [(f"output.{n}", a) for n, a in outputs]
    keys = [k for k, _ in named]
    st = SelfTest(member, tuple(keys[: len(inputs)]), tuple(keys[len(inputs) :]), rtol, atol)
    return st, encode_tensors(named)
