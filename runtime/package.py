"""Reading a package: the ZIP container, bound checks, sha256 checks, and zero-copy weights.

What it is: ``Package(path)`` maps the file once, walks the ZIP central directory with every offset checked
against the file, reads and validates the manifest, and hands out members only after their sha256 matched
(``view`` for zero-copy data, ``read`` for a checked private copy that is what later reaches ``dlopen``).
``weights()`` parses the safetensors header itself and returns numpy views into the mapping.
What it is not: a general ZIP reader. A package is written by ``aotc_build.package``: stored members only,
no encryption, no multi-disk, no data descriptors; anything else is refused as corrupt.

Note: ``aotc.load`` checks the hashes of every member it may use (``verify_members``) before any code is
loaded, several threads at once: members over HASH_CHUNK bytes carry one sha256 per chunk, so one big
weight blob is checked in parallel too. A member first used later (``view``) is checked then. Weights stay
mapped, so a file rewritten in place after loading changes them; code is copied out and hashed as copied.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import mmap
import os
import stat
import struct
import threading
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .errors import PackageCorrupt, UsageError
from .schema import (
    HASH_CHUNK,
    ITEMSIZE,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Manifest,
    TensorSpec,
    Weights,
    check_member_name,
    from_json,
    strict_json,
)
from .schema import numpy_dtype as _np_dtype

if TYPE_CHECKING:
    from dataclasses import dataclass
else:
    from .records import dataclass  # no methods compiled at import (see aotc.records)

# ---- the ZIP records (shared with the writer, aotc_build.package) -----------------------------------------
LOCAL = struct.Struct("<IHHHHHIIIHH")  # sig ver flags method time date crc csize usize nlen xlen
CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # sig made ver flags method time date crc csize usize
#                                                 nlen xlen clen disk iattr eattr offset
EOCD = struct.Struct("<IHHHHIIH")  # sig disk cd_disk n_disk n_total cd_size cd_off comment_len
EOCD64 = struct.Struct("<IQHHIIQQQQ")  # sig rest_size made ver disk cd_disk n_disk n_total cd_size cd_off
LOCATOR64 = struct.Struct("<IIQI")  # sig disk eocd64_off n_disks
LOCAL_SIG, CENTRAL_SIG, EOCD_SIG = 0x04034B50, 0x02014B50, 0x06054B50
EOCD64_SIG, LOCATOR64_SIG = 0x06064B50, 0x07064B50
ZIP64_EXTRA = 0x0001
ALIGN_EXTRA = 0xD935  # the id Android's zipalign uses for its padding record
ALIGN = 64  # member data (and every weight tensor the writer lays out) starts on a 64-byte boundary
MAX32 = 0xFFFFFFFF
MAX_MEMBERS = 1 << 16

# ---- safetensors ---------------------------------------------------------------------------------------
ST_DTYPES = {
    "float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}  # fmt: skip
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}
PAD_PREFIX = "__aotc_pad_"  # filler tensors the writer inserts so that every real tensor is aligned
MAX_ST_HEADER = 100 << 20


def _corrupt(path: Path, what: str) -> PackageCorrupt:
    return PackageCorrupt(f"{path}: {what}; the package is damaged: copy it again or rebuild it")


@dataclass(frozen=True)
class Entry:
    """One ZIP member: where its data starts in the file, its size and its CRC-32."""

    offset: int
    size: int
    crc: int


def _zip64_fields(extra: bytes, want: int) -> list[int]:
    """The first ``want`` 8-byte values of the zip64 extra record."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, pos)
        if tag == ZIP64_EXTRA:
            if n < 8 * want or pos + 4 + n > len(extra):
                break
            return list(struct.unpack_from(f"<{want}Q", extra, pos + 4))
        pos += 4 + n
    raise ValueError("missing zip64 extra record")


def read_entries(mm: mmap.mmap | bytes, path: Path) -> dict[str, Entry]:
    """Every member of the ZIP with its data range, each range checked to lie inside the file."""
    try:
        return _read_entries(mm, path)
    except struct.error as e:  # a record that runs off the end of the file
        raise _corrupt(path, f"ZIP record out of bounds ({e})") from None


def _read_entries(mm: mmap.mmap | bytes, path: Path) -> dict[str, Entry]:
    n = len(mm)
    if n < EOCD.size:
        raise _corrupt(path, f"only {n} bytes, too short to be a package")
    pos = mm.rfind(struct.pack("<I", EOCD_SIG), max(0, n - EOCD.size - 0xFFFF), n - EOCD.size + 4)
    if pos < 0:
        raise _corrupt(path, "no ZIP end-of-central-directory record (not a package, or truncated)")
    _, disk, cd_disk, n_disk, n_total, cd_size, cd_off, clen = EOCD.unpack_from(mm, pos)
    if pos + EOCD.size + clen != n:
        raise _corrupt(path, "bytes after the ZIP end record (truncated or appended to)")
    end = pos
    if MAX32 in (cd_size, cd_off) or 0xFFFF in (n_disk, n_total):
        loc = pos - LOCATOR64.size
        if loc < 0 or struct.unpack_from("<I", mm, loc)[0] != LOCATOR64_SIG:
            raise _corrupt(path, "zip64 locator missing")
        e64 = LOCATOR64.unpack_from(mm, loc)[2]
        if e64 + EOCD64.size > loc or struct.unpack_from("<I", mm, e64)[0] != EOCD64_SIG:
            raise _corrupt(path, "zip64 end record missing")
        _, _, _, _, disk, cd_disk, n_disk, n_total, cd_size, cd_off = EOCD64.unpack_from(mm, e64)
        end = e64
    if disk or cd_disk or n_disk != n_total:
        raise _corrupt(path, "multi-disk ZIP archives are not packages")
    if n_total > MAX_MEMBERS or cd_off + cd_size > end:
        raise _corrupt(path, "ZIP central directory out of bounds")
    entries: dict[str, Entry] = {}
    p = cd_off
    for _ in range(n_total):
        if p + CENTRAL.size > cd_off + cd_size:
            raise _corrupt(path, "ZIP central directory truncated")
        (sig, _, _, flags, method, _, _, crc, csize, usize, nlen, xlen, clen2, _, _, _, off) = CENTRAL.unpack_from(mm, p)
        name_end = p + CENTRAL.size + nlen
        if sig != CENTRAL_SIG or name_end + xlen + clen2 > cd_off + cd_size:
            raise _corrupt(path, "bad ZIP central directory entry")
        raw_name = bytes(mm[p + CENTRAL.size : name_end])
        extra = bytes(mm[name_end : name_end + xlen])
        p = name_end + xlen + clen2
        try:
            name = raw_name.decode("ascii")
            big = [v for v in (usize, csize, off) if v == MAX32]
            if big:
                vals = iter(_zip64_fields(extra, len(big)))
                usize = next(vals) if usize == MAX32 else usize
                csize = next(vals) if csize == MAX32 else csize
                off = next(vals) if off == MAX32 else off
        except (UnicodeDecodeError, ValueError) as e:
            raise _corrupt(path, f"bad ZIP entry {raw_name!r}: {e}") from None
        if name != MANIFEST:
            try:
                check_member_name(name)
            except PackageCorrupt:
                raise _corrupt(path, f"unsafe member name {name!r}") from None
        if name in entries:
            raise _corrupt(path, f"duplicate member {name!r}")
        if method != 0 or flags & 0x1 or csize != usize:
            raise _corrupt(path, f"member {name!r} is compressed or encrypted; packages store members as-is")
        if off + LOCAL.size > cd_off:
            raise _corrupt(path, f"member {name!r} header out of bounds")
        lsig, _, _, lmethod, _, _, _, _, _, lnlen, lxlen = LOCAL.unpack_from(mm, off)
        data = off + LOCAL.size + lnlen + lxlen
        if lsig != LOCAL_SIG or lmethod != 0 or bytes(mm[off + LOCAL.size : off + LOCAL.size + lnlen]) != raw_name:
            raise _corrupt(path, f"member {name!r}: local header disagrees with the central directory")
        if data + usize > cd_off:
            raise _corrupt(path, f"member {name!r} data runs past the end of the member area")
        entries[name] = Entry(data, usize, crc)
    return entries


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

    def __init__(self, path: str | Path, trusted_keys: Trust | None = None) -> None:
        """``trusted_keys`` (``aotc.signing.public_keys``): when given, the package must be signed by one of
        them, checked before the manifest is parsed; ``signer`` is then the key that signed it."""
        self.path = Path(path)
        self._mm = _map(self.path)
        self.size = len(self._mm)
        self._verified: set[str] = set()
        self._weights: list[np.ndarray] | None = None
        self.entries = read_entries(self._mm, self.path)
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

    def verify_members(self, members: Iterable[str], threads: int | None = None) -> None:
        """Check the sha256 of every member named (its chunks' when it has them) now, on up to ``threads``
        threads (default: the cores this process may use, at most 8); hashlib releases the GIL, so the
        threads hash at once. Raises PackageCorrupt naming the first member, in the order given, that fails."""
        names = [n for n in dict.fromkeys(members) if n not in self._verified]
        jobs: list[tuple[int, int, str, int]] = []  # (start, end, digest wanted, index of the member)
        for j, name in enumerate(names):
            e, mem = self._entry(name), self.manifest.members[name]
            if mem.chunks:
                for i, want in enumerate(mem.chunks):
                    start = e.offset + i * HASH_CHUNK
                    jobs.append((start, min(start + HASH_CHUNK, e.offset + e.size), want, j))
            else:
                jobs.append((e.offset, e.offset + e.size, mem.sha256, j))
        jobs.sort(key=lambda job: job[0] - job[1])  # largest first: the threads finish together
        failed: list[int] = []
        mv = memoryview(self._mm)
        todo = iter(jobs)  # shared: a list iterator hands each job to exactly one thread

        def work() -> None:
            for start, end, want, j in todo:
                if hashlib.sha256(mv[start:end]).hexdigest() != want:
                    failed.append(j)

        total = sum(end - start for start, end, _, _ in jobs)
        n = min(threads or _hash_threads(), len(jobs), 1 + total // (4 << 20))  # small work: this thread alone
        helpers = [threading.Thread(target=work, name="aotc-sha256", daemon=True) for _ in range(n - 1)]
        for t in helpers:
            t.start()
        work()
        for t in helpers:
            t.join()
        if failed:
            name = names[min(failed)]
            e = self._entry(name)
            self._verify(name, hashlib.sha256(mv[e.offset : e.offset + e.size]).hexdigest())  # names both digests
            raise _corrupt(self.path, f"member {name!r} fails its chunk sha256 check")  # chunks lie, the whole agrees
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
        # Arrays may still view the mapping; then it is unmapped when the last of them goes.
        with contextlib.suppress(BufferError):
            self._mm.close()

    def __enter__(self) -> Package:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _hash_threads() -> int:
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return max(1, min(8, os.cpu_count() or 1))


def _map(path: Path) -> mmap.mmap:
    """The package file mapped read-only. Anything but a regular, non-empty file is refused at once: opened
    non-blocking, so a FIFO cannot hang the open, and checked with fstat before a byte is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UsageError(f"package {path} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, not a package file") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise UsageError(f"cannot open package {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{path} is a directory, not a package file")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is not a regular file (a FIFO, device or socket): pass the package file itself")
        if st.st_size == 0:
            raise _corrupt(path, "empty file (or a file like those under /proc that has no fixed size)")
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise _corrupt(path, f"cannot be mapped ({getattr(e, 'strerror', None) or e})") from None
    finally:
        os.close(fd)


def _describe(spec: TensorSpec) -> str:
    return f"{spec.dtype}{list(spec.shape)}"
