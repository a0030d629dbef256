"""Reading a package: the manifest, sha256 checks, and zero-copy weights.

What it is: ``Package(path)`` maps the file once, walks the ZIP central directory with every offset checked
against the file (``aotc.container``), reads and validates the manifest, and hands out members only after their sha256 matched
(``view`` for zero-copy data, ``read`` for a checked private copy that is what later reaches ``dlopen``).
``weights()`` parses the safetensors header itself and returns numpy views into the mapping.
What it is not: a general ZIP reader. A package is written by ``aotc_build.package``: stored members only,
no encryption, no multi-disk, no data descriptors; anything else is refused as corrupt.

Note: ``aotc.load`` checks the hashes of every member it may use (``verify_members``) before any code is
loaded, several threads at once: members over HASH_CHUNK bytes carry one sha256 per chunk, so one big
weight blob is checked in parallel too; ``aotc.load`` starts that hashing before it parses the manifest.
A member first used later (``view``) is checked then. Weights stay mapped, so a file rewritten in place
after loading changes them; code is copied out and hashed as copied.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import mmap
import struct
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .container import ALIGN, Container, Entry, _corrupt, member_ranges, read_entries  # noqa: F401  (read_entries: aotc.package's API)
from .errors import PackageCorrupt
from .schema import (
    ITEMSIZE,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Manifest,
    TensorSpec,
    Weights,
    from_json,
    strict_json,
)
from .schema import numpy_dtype as _np_dtype

if TYPE_CHECKING:
    from dataclasses import dataclass
else:
    from .records import dataclass  # no methods compiled at import (see aotc.records)

# ---- safetensors ---------------------------------------------------------------------------------------
ST_DTYPES = {
    "float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}  # fmt: skip
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}
PAD_PREFIX = "__aotc_pad_"  # filler tensors the writer inserts so that every real tensor is aligned
MAX_ST_HEADER = 100 << 20


# ---- safetensors parsing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StTensor:
    dtype: str  # manifest dtype name
    shape: tuple[int, ...]
    begin: int  # byte offset from the start of the safetensors member
    end: int


def parse_safetensors(buf: memoryview, member: str) -> dict[str, StTensor]:
    """The tensors of a safetensors blob, with every offset, shape and dtype checked; offsets returned are
    relative to the start of the blob. Filler tensors (PAD_PREFIX) are checked and left out."""

    def bad(what: str) -> PackageCorrupt:
        return PackageCorrupt(f"{member}: {what}; the package is damaged: copy it again or rebuild it")

    if len(buf) < 8:
        raise bad("too short for a safetensors header")
    (hlen,) = struct.unpack_from("<Q", buf, 0)
    if hlen > min(MAX_ST_HEADER, len(buf) - 8):
        raise bad(f"safetensors header length {hlen} out of bounds")
    try:
        header = strict_json(bytes(buf[8 : 8 + hlen]), "the safetensors header")
    except PackageCorrupt as e:
        raise bad(str(e)) from None
    if not isinstance(header, dict):
        raise bad("safetensors header is not an object")
    base = 8 + hlen
    size = len(buf) - base
    out: dict[str, StTensor] = {}
    spans: list[tuple[int, int, str]] = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = ST_NAMES[t["dtype"]]
            shape = tuple(t["shape"])
            begin, end = t["data_offsets"]
            ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (*shape, begin, end))
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise bad(f"tensor {name!r} has a malformed header entry {t!r}")
        if not begin <= end <= size or end - begin != math.prod(shape) * ITEMSIZE[dtype]:
            raise bad(f"tensor {name!r}: data_offsets {begin}..{end} disagree with {dtype}{list(shape)}")
        spans.append((begin, end, name))
        if name.startswith(PAD_PREFIX):
            if dtype != "uint8" or len(shape) != 1:
                raise bad(f"filler tensor {name!r} is not a 1-D uint8 tensor")
            continue
        out[name] = StTensor(dtype, shape, base + begin, base + end)
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise bad(f"tensor {name!r} starts at {begin}, expected {pos} (overlap or hole)")
        pos = end
    if pos != size:
        raise bad(f"{size - pos} bytes after the last tensor")
    return out


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data pointer is ``align``-byte aligned."""
    raw = np.empty(nbytes + align, np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip : skip + nbytes]


class Trust(Protocol):
    """What ``Package`` needs of trusted keys (``aotc.signing.TrustedKeys``): the signer, or a refusal."""

    def check(self, buf: mmap.mmap, entries: Mapping[str, Any], manifest: bytes, path: Path) -> object: ...


# ---- the package ---------------------------------------------------------------------------------------


class Package:
    """An opened package: checked structure and manifest; members handed out only after their hash matched."""

    def __init__(self, path: str | Path, trusted_keys: Trust | None = None, container: Container | None = None) -> None:
        """``trusted_keys`` (``aotc.signing.public_keys``): when given, the package must be signed by one of
        them, checked before the manifest is parsed; ``signer`` is then the key that signed it.
        ``container``: the file already opened (``aotc.container.Container(path)``, hashing maybe under way)."""
        self.path = Path(path)
        opened = Container(self.path) if container is None else container
        self._mm = opened.mm
        self._hashes = opened.hashes
        self.size = len(self._mm)
        self._verified: set[str] = set()
        self._weights: list[np.ndarray] | None = None
        self.entries = opened.entries
        if MANIFEST not in self.entries:
            raise _corrupt(self.path, f"no {MANIFEST} (not an aotc package?)")
        me = self.entries[MANIFEST]
        if me.size > MAX_MANIFEST_BYTES:
            raise _corrupt(self.path, f"{MANIFEST} is {me.size} bytes, over the {MAX_MANIFEST_BYTES} byte limit")
        text = self._mm[me.offset : me.offset + me.size]
        self.signer: object = None
        if trusted_keys is not None:  # an unsigned or forged manifest is refused before it is parsed
            self.signer = trusted_keys.check(self._mm, self.entries, text, self.path)
        # The manifest cannot list its own hash; its CRC-32 still catches a flipped digit in a shape.
        if zlib.crc32(text) != me.crc:
            raise _corrupt(self.path, f"{MANIFEST} fails its CRC-32 check")
        self.manifest: Manifest = from_json(text)
        listed = self.manifest.members
        for name, e in self.entries.items():
            if name == MANIFEST:
                continue
            if name not in listed:
                raise _corrupt(self.path, f"member {name!r} is not listed in the manifest")
            if listed[name].size != e.size:
                raise _corrupt(self.path, f"member {name!r} is {e.size} bytes, the manifest says {listed[name].size}")
        for name in listed:
            if name not in self.entries:
                raise _corrupt(self.path, f"member {name!r} is listed in the manifest but missing")

    # -- members --

    def _entry(self, member: str) -> Entry:
        if member not in self.manifest.members:
            raise _corrupt(self.path, f"member {member!r} is not in this package")
        return self.entries[member]

    def _verify(self, member: str, got: str) -> None:
        want = self.manifest.members[member].sha256
        if got != want:
            what = f"member {member!r} has sha256 {got[:16]}…, the manifest says {want[:16]}…"
            raise _corrupt(self.path, what)

    def view(self, member: str) -> memoryview:
        """A zero-copy, hash-checked, read-only view of a member's bytes."""
        e = self._entry(member)
        if member not in self._verified:
            self.verify_members([member])
        return memoryview(self._mm)[e.offset : e.offset + e.size]

    def verify_members(self, members: Iterable[str], threads: int | None = None, drop_others: bool = False) -> None:
        """Check the sha256 of every member named (its chunks' when it has them) now, on up to ``threads``
        threads (default: the cores this process may use, at most 8); hashlib releases the GIL, so the
        threads hash at once. Raises PackageCorrupt naming the first member, in the order given, that fails.
        ``drop_others``: stop hashing ahead the members not named (a load that will not use them)."""
        names = [n for n in dict.fromkeys(members) if n not in self._verified]
        jobs: list[tuple[tuple[int, int], str, str]] = []  # (range, digest wanted, member)
        for name in names:
            e, mem = self._entry(name), self.manifest.members[name]
            ranges = member_ranges(e.offset, e.size)
            wants = mem.chunks if mem.chunks else (mem.sha256,)
            if len(wants) != len(ranges):  # the schema checks the count; this keeps a mismatch from passing
                raise _corrupt(self.path, f"member {name!r} lists {len(wants)} chunk hashes for {len(ranges)} chunks")
            jobs += [(r, want, name) for r, want in zip(ranges, wants, strict=True)]
        if drop_others:
            self._hashes.drop({r for n, e in self.entries.items() if n not in names for r in member_ranges(e.offset, e.size)})
        got = self._hashes.digests([r for r, _, _ in jobs], threads)
        failed = next((name for r, want, name in jobs if got[r] != want), None)
        if failed is not None:
            e = self._entry(failed)
            self._verify(failed, hashlib.sha256(memoryview(self._mm)[e.offset : e.offset + e.size]).hexdigest())  # names both digests
            raise _corrupt(self.path, f"member {failed!r} fails its chunk sha256 check")  # chunks lie, the whole agrees
        self._verified.update(names)

    def read(self, member: str) -> bytes:
        """A private copy of a member, hashed after copying: the bytes returned are the bytes checked.
        Use this for anything that becomes code (a .so for dlopen, a cubin for cuModuleLoadData)."""
        e = self._entry(member)
        data = self._mm[e.offset : e.offset + e.size]
        self._verify(member, hashlib.sha256(data).hexdigest())
        return data

    def check(self, member: str) -> bool:
        """Whether a listed member's bytes match the manifest's sha256 and chunk hashes (no exception; for
        ``inspect``, which hashes every member whole as well, unlike ``load``)."""
        e = self._entry(member)
        try:
            self._verify(member, hashlib.sha256(memoryview(self._mm)[e.offset : e.offset + e.size]).hexdigest())
            self.verify_members([member])
        except PackageCorrupt:
            return False
        return True

    # -- tensors --

    def _array(self, base: int, t: StTensor) -> np.ndarray:
        dt = _np_dtype(t.dtype)
        count = math.prod(t.shape)
        start = base + t.begin
        if count == 0:
            return np.empty(t.shape, dt)
        arr = np.frombuffer(self._mm, dt, count, start).reshape(t.shape)
        if start % ALIGN:
            # The ABI promises 64-byte aligned weights; a blob written without aotc's layout gets a copy.
            out = aligned_empty(arr.nbytes).view(dt).reshape(t.shape)
            out[...] = arr
            out.flags.writeable = False
            return out
        return arr

    def tensors(self, member: str) -> dict[str, np.ndarray]:
        """Every tensor of a safetensors member (e.g. the self-test) as arrays, in file order."""
        mv = self.view(member)
        base = self._entry(member).offset
        return {n: self._array(base, t) for n, t in parse_safetensors(mv, member).items()}

    def weights(self, section: Weights | None = None) -> list[np.ndarray]:
        """The weight tensors in manifest (ABI) order: read-only views into the mapping, 64-byte aligned.
        ``section``: another weights section of the manifest (a CPU target's packed weights)."""
        if section is not None and section != self.manifest.weights:
            return self._section(section)
        if self._weights is None:
            self._weights = self._section(self.manifest.weights)
        return self._weights

    def _section(self, w: Weights) -> list[np.ndarray]:
        found = parse_safetensors(self.view(w.member), w.member)
        base = self._entry(w.member).offset
        out = []
        for spec in w.tensors:
            t = found.pop(spec.name, None)
            if t is None:
                raise _corrupt(self.path, f"weight {spec.name!r} is missing from {w.member}")
            if t.dtype != spec.dtype or t.shape != spec.shape:
                raise _corrupt(
                    self.path,
                    f"weight {spec.name!r} is {t.dtype}{list(t.shape)} in {w.member}, the manifest says {_describe(spec)}",
                )
            out.append(self._array(base, t))
        if found:
            raise _corrupt(self.path, f"{w.member} holds tensors the manifest does not list: {sorted(found)[:5]}")
        return out

    def close(self) -> None:
        self._weights = None
        self._hashes.close()
        # Arrays may still view the mapping; then it is unmapped when the last of them goes.
        with contextlib.suppress(BufferError):
            self._mm.close()

    def __enter__(self) -> Package:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _describe(spec: TensorSpec) -> str:
    return f"{spec.dtype}{list(spec.shape)}"
