"""The package file as a ZIP container: mapped once, every member's data range checked, and the sha256 of
those ranges computed on threads from the moment the file is open.

What it is: ``map_file`` (the file mapped read-only, non-regular files refused), ``read_entries`` (every
member with its data range, each checked to lie inside the file), and ``Container`` (the two together, with
an ``aotc.hashing.Hashes`` already hashing every member's data). ``aotc.package.Package`` builds on it.
What it is not: the manifest or any judgement of a digest. Digests are computed here; ``Package`` compares
them with the manifest's, and hands out no member before they match.

Note (why a module of its own): a cold start (new process -> ``aotc.load`` -> first output) spends ~20 ms
importing the schema and parsing the manifest on one thread, and a large package's weights take longer to
hash than that. This module imports only the standard library, and of it only what the hashing needs
(not ``typing`` nor ``dataclasses``, whose import pulls in ``inspect``: ~9 ms before the first digest in
a script that calls ``aotc.load`` before importing numpy), so ``aotc.load`` maps the file and starts the
hashing threads first, and they hash while the main thread imports and parses (see aotc.loading).
"""

from __future__ import annotations

import collections
import mmap
import os
import stat
import struct
from pathlib import Path

from .errors import PackageCorrupt, UsageError
from .hashing import HASH_CHUNK, Hashes, ahead_threads

TYPE_CHECKING = False  # not typing's: see the Note
if TYPE_CHECKING:
    from typing import NamedTuple

MANIFEST = "manifest.json"

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


def _corrupt(path: Path, what: str) -> PackageCorrupt:
    return PackageCorrupt(f"{path}: {what}; the package is damaged: copy it again or rebuild it")


def member_name_ok(path: str) -> bool:
    """Whether a member path is relative, '/'-separated, without '.', '..' or empty parts (no path traversal)."""
    return bool(
        path
        and len(path) <= 512
        and path != MANIFEST
        and not path.startswith("/")
        and "\\" not in path
        and "\0" not in path
        and path.isascii()
        and not any(p in ("", ".", "..") for p in path.split("/"))
    )


def member_ranges(offset: int, size: int) -> list[tuple[int, int]]:
    """The byte ranges of the file a member's digests cover: the whole member, or its HASH_CHUNK-byte pieces
    when it is larger (those carry one sha256 each in the manifest)."""
    if size <= HASH_CHUNK:
        return [(offset, offset + size)]
    return [(s, min(s + HASH_CHUNK, offset + size)) for s in range(offset, offset + size, HASH_CHUNK)]


if TYPE_CHECKING:

    class Entry(NamedTuple):
        """One ZIP member: where its data starts in the file, its size and its CRC-32."""

        offset: int
        size: int
        crc: int

else:
    Entry = collections.namedtuple("Entry", ("offset", "size", "crc"))
    Entry.__doc__ = "One ZIP member: where its data starts in the file, its size and its CRC-32."


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
        if name != MANIFEST and not member_name_ok(name):
            raise _corrupt(path, f"unsafe member name {name!r}")
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


def map_file(path: Path) -> mmap.mmap:
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


class Container:
    """A package file mapped, its members' ranges read, and their hashing started (``hash_ahead``)."""

    def __init__(self, path: str | Path, hash_ahead: bool = False) -> None:
        """``hash_ahead``: start hashing every member now, on the cores but one while the machine is otherwise
        idle (the caller's thread has imports and the manifest to get through first; hashing.ahead_threads);
        small packages are hashed when asked instead."""
        self.path = Path(path)
        self.mm = map_file(self.path)
        self.entries = read_entries(self.mm, self.path)
        self.hashes = Hashes(memoryview(self.mm))
        if hash_ahead:
            ranges = [r for n, e in self.entries.items() if n != MANIFEST for r in member_ranges(e.offset, e.size)]
            self.hashes.start(ranges, helpers=ahead_threads(ranges))
