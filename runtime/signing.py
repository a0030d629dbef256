"""Package signatures: ed25519 over the manifest (which holds every member's sha256) and the ZIP records.

What it is: ``keygen`` (a key pair as PEM files, readable by OpenSSL), ``sign`` (adds a signature to a
package, atomically), ``check`` (which ``aotc.package.Package`` calls, given trusted keys, before it parses
the manifest) and ``describe`` (the signature's state, for ``aotc inspect``). The ``cryptography`` library
is imported only here and only when a signature is made or checked, so the bare runtime stays numpy+cffi:
``pip install 'aotc[sign]'`` adds it.
What it is not: key management. Keys are files; which keys a server trusts is its own decision.

Note: where the signature lives. The ZIP archive comment (the last bytes of the file, after the end
record) holds ``aotc-signature-1:{json}``, so signing changes no member, no offset and no hash, and
removing the comment gives back the unsigned package byte for byte. What is signed is a digest of
(1) the manifest's bytes, which list every member's size and sha256 (chunk hashes too), and (2) every byte
of the file that is not member data (local headers and their padding, the central directory, the end
records up to the comment's length field). Member data is covered by the hashes in (1), which ``load``
checks before any code runs; so a change of any byte of a signed package is refused.
"""

from __future__ import annotations

import base64
import hashlib
import json
import mmap
import os
import secrets
import stat
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PackageCorrupt, UntrustedPackage, UsageError

MARK = b"aotc-signature-1:"  # the ZIP comment of a signed package starts with this, then one JSON object
DOMAIN = b"aotc-package-signature-1\0"  # what a signature means, so it is never valid for other data
ALGORITHM = "ed25519"
EOCD_SIG = struct.pack("<I", 0x06054B50)
EOCD_SIZE = 22
COMMENT_LEN_AT = 20  # the comment's length field within the end record
MAX_KEY_FILE = 64 << 10
TrustedKey = str | os.PathLike[str] | bytes
Buf = mmap.mmap | bytes


@dataclass(frozen=True)
class PublicKey:
    raw: bytes  # the 32-byte ed25519 public key

    @property
    def key_id(self) -> str:
        """The key's fingerprint: the first 16 hex digits of the sha256 of its raw bytes."""
        return hashlib.sha256(self.raw).hexdigest()[:16]


@dataclass(frozen=True)
class Signature:
    key: PublicKey
    value: bytes  # 64 bytes


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise UsageError("package signatures need the cryptography library: pip install 'aotc[sign]'") from None
    return ed25519


# ---- keys ----------------------------------------------------------------------------------------------


def keygen(path: str | os.PathLike[str]) -> PublicKey:
    """Write a new private key to PATH (mode 0600, refusing to overwrite) and its public key to PATH.pub."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization as ser

    key = ed25519.Ed25519PrivateKey.generate()
    pub = key.public_key()
    private_pem = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    public_pem = pub.public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    priv, public = Path(path), Path(f"{os.fspath(path)}.pub")
    for p in (priv, public):
        if p.exists() or p.is_symlink():
            raise UsageError(f"{p} exists; keygen does not overwrite keys: choose another name or remove it")
    _write_new(priv, private_pem, 0o600)
    _write_new(public, public_pem, 0o644)
    return PublicKey(pub.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw))


def _write_new(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_bytes(spec: TrustedKey, what: str) -> tuple[bytes, str]:
    """A key file's bytes (or the bytes given) and how to name it in messages."""
    if isinstance(spec, bytes):
        return spec, f"the {what} given as bytes"
    if not isinstance(spec, str | os.PathLike):
        raise UsageError(f"a {what} is a path (str or os.PathLike) or PEM bytes, got {type(spec).__name__}")
    try:
        fd = os.open(spec, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # non-blocking: a FIFO cannot hang us
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {what} {os.fspath(spec)}: {getattr(e, 'strerror', None) or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{what} {os.fspath(spec)} is not a regular file")
        data = os.read(fd, MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE:
        raise UsageError(f"{what} {os.fspath(spec)} is over {MAX_KEY_FILE} bytes: not a key file")
    return data, f"{what} {os.fspath(spec)}"


def public_key(spec: TrustedKey) -> PublicKey:
    """A trusted public key from a PEM file (``aotc keygen``'s KEY.pub, or ``openssl pkey -pubout``), PEM
    bytes, or the 32 raw bytes."""
    data, name = _key_bytes(spec, "trusted key")
    if isinstance(spec, bytes) and len(data) == 32:
        return PublicKey(data)
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization as ser

    try:
        key = ser.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        hint = " (that is a private key: pass the .pub file)" if b"PRIVATE KEY" in data else ""
        raise UsageError(f"{name} is not a PEM public key{hint}: {e}") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise UsageError(f"{name} is not an ed25519 key (aotc signatures are ed25519: make one with aotc keygen)")
    return PublicKey(key.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw))


class TrustedKeys(tuple[PublicKey, ...]):
    """The keys a package must be signed by; ``aotc.package.Package`` calls ``check`` (so that the package
    reader does not import this module, which imports it to sign)."""

    def check(self, buf: Buf, entries: Mapping[str, Any], manifest: bytes | memoryview, path: Path) -> PublicKey:
        return check(buf, ranges(entries), manifest, self, path)


def public_keys(specs: Iterable[TrustedKey]) -> TrustedKeys:
    """Every trusted key, read and parsed now (a bad key file is a UsageError before any package is read)."""
    if isinstance(specs, str | bytes | os.PathLike) or not isinstance(specs, Iterable):
        raise UsageError(f"trusted_keys is a list of key paths or PEM bytes, got {type(specs).__name__}")
    keys = TrustedKeys(public_key(s) for s in specs)
    if not keys:
        raise UsageError("trusted_keys is empty: name at least one public key (or pass None to load unsigned packages)")
    return keys


def _private_key(spec: str | os.PathLike[str]) -> Any:
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization as ser

    data, name = _key_bytes(spec, "key")
    try:
        key = ser.load_pem_private_key(data, password=None)
    except TypeError:
        raise UsageError(f"{name} is encrypted; aotc sign reads unencrypted PEM keys (aotc keygen makes one)") from None
    except ValueError as e:
        hint = " (that is a public key: sign with the private one)" if b"PUBLIC KEY" in data else ""
        raise UsageError(f"{name} is not a PEM private key{hint}: {e}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"{name} is not an ed25519 key (aotc signatures are ed25519: make one with aotc keygen)")
    return key


# ---- what is signed ------------------------------------------------------------------------------------


def _end_record(buf: Buf) -> int:
    """The offset of the ZIP end record whose comment runs to the end of the file (as aotc.package finds it)."""
    n = len(buf)
    pos = buf.rfind(EOCD_SIG, max(0, n - EOCD_SIZE - 0xFFFF), n - EOCD_SIZE + 4)
    if pos < 0 or pos + EOCD_SIZE + struct.unpack_from("<H", buf, pos + COMMENT_LEN_AT)[0] != n:
        raise PackageCorrupt("no ZIP end-of-central-directory record (not a package, or truncated)")
    return pos


def digest(buf: Buf, data_ranges: Iterable[tuple[int, int]], manifest: bytes | memoryview) -> bytes:
    """What a signature signs: DOMAIN, the manifest's sha256, and the sha256 of every byte of the file up to
    the comment's length field that is not member data (``data_ranges``: each member's (offset, size))."""
    end = _end_record(buf) + COMMENT_LEN_AT
    h = hashlib.sha256()
    pos = 0
    for offset, size in sorted(data_ranges):
        begin, stop = max(offset, pos), min(offset + size, end)
        if begin > pos:
            h.update(memoryview(buf)[pos:begin])
        pos = max(pos, stop)
    if pos < end:
        h.update(memoryview(buf)[pos:end])
    return DOMAIN + hashlib.sha256(manifest).digest() + h.digest()


def read_signature(buf: Buf, path: Path | str = "the package") -> Signature | None:
    """The signature in the package's ZIP comment, or None when it has none. Raises UntrustedPackage when
    the comment claims to be a signature but is malformed."""
    pos = _end_record(buf)
    comment = bytes(buf[pos + EOCD_SIZE :])
    if not comment.startswith(MARK):
        return None
    try:
        d = json.loads(comment[len(MARK) :].decode("ascii"))
        if not isinstance(d, dict) or set(d) != {"algorithm", "key", "signature"} or d["algorithm"] != ALGORITHM:
            raise ValueError("unknown fields or algorithm")
        raw, value = base64.b64decode(d["key"], validate=True), base64.b64decode(d["signature"], validate=True)
        if len(raw) != 32 or len(value) != 64:
            raise ValueError("wrong key or signature length")
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as e:
        raise UntrustedPackage(f"{path}: its signature record is malformed ({e}): sign it again with aotc sign") from None
    return Signature(PublicKey(raw), value)


def _valid(sig: Signature, message: bytes) -> bool:
    ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(sig.key.raw).verify(sig.value, message)
    except InvalidSignature:
        return False
    return True


def check(
    buf: Buf, data_ranges: Iterable[tuple[int, int]], manifest: bytes | memoryview, trusted: Sequence[PublicKey], path: Path
) -> PublicKey:
    """The trusted key that signed this package, or UntrustedPackage saying why there is none."""
    sig = read_signature(buf, path)
    if sig is None:
        raise UntrustedPackage(f"{path} is not signed, and a signature is required: sign it with aotc sign PKG --key KEY")
    if sig.key not in trusted:
        ids = ", ".join(k.key_id for k in trusted)
        raise UntrustedPackage(
            f"{path} is signed by key {sig.key.key_id}, which is not a trusted key ({ids}): pass its .pub with --trusted-key to trust it"
        )
    if not _valid(sig, digest(buf, data_ranges, manifest)):
        raise UntrustedPackage(
            f"{path}: the signature by key {sig.key.key_id} does not match the package (changed after signing): copy the signed one again"
        )
    return sig.key


def describe(
    buf: Buf, data_ranges: Iterable[tuple[int, int]], manifest: bytes | memoryview, trusted: Sequence[PublicKey] = ()
) -> tuple[str, bool]:
    """The signature's state in words (for ``aotc inspect``), and whether it is bad (malformed, or not
    matching the package). Checked against the key in the signature itself, which proves that nothing
    changed since signing, not who signed: that needs a trusted key."""
    try:
        sig = read_signature(buf)
    except UntrustedPackage as e:
        return str(e), True
    if sig is None:
        return "none (aotc sign PKG --key KEY adds one)", False
    try:
        ok = _valid(sig, digest(buf, data_ranges, manifest))
    except UsageError:
        return f"{ALGORITHM}, key {sig.key.key_id} (not checked: pip install 'aotc[sign]')", False
    if not ok:
        return f"INVALID: {ALGORITHM}, key {sig.key.key_id}, does not match the package (changed after signing)", True
    who = "a trusted key" if sig.key in trusted else "not checked against trusted keys: --trusted-key KEY.pub does"
    return f"valid, {ALGORITHM}, key {sig.key.key_id} ({who})", False


# ---- signing -------------------------------------------------------------------------------------------


def sign(package: str | os.PathLike[str], key: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> PublicKey:
    """Sign PACKAGE with the private KEY, writing the signed package to OUT (default: PACKAGE itself,
    replaced atomically). The package is checked first, every member's hash included: a damaged package
    is refused, never signed. A signature already there is replaced."""
    from .package import Package
    from .schema import MANIFEST

    private = _private_key(key)
    with Package(Path(package)) as pkg:
        bad = [n for n in pkg.manifest.members if not pkg.check(n)]
        if bad:
            raise PackageCorrupt(f"{package}: sha256 mismatch in {', '.join(bad)}; refusing to sign a damaged package")
        mm = pkg._mm
        m = pkg.entries[MANIFEST]
        message = digest(mm, ranges(pkg.entries), mm[m.offset : m.offset + m.size])
        pub = PublicKey(private.public_key().public_bytes_raw())
        value = private.sign(message)
        record = {"algorithm": ALGORITHM, "key": base64.b64encode(pub.raw).decode(), "signature": base64.b64encode(value).decode()}
        comment = MARK + json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        end = _end_record(mm) + COMMENT_LEN_AT
        _write_atomic(Path(out if out is not None else package), [memoryview(mm)[:end], struct.pack("<H", len(comment)), comment])
    return pub


def ranges(entries: Mapping[str, Any]) -> list[tuple[int, int]]:
    """Each member's data range (offset, size) from ``aotc.package.read_entries``' entries."""
    return [(e.offset, e.size) for e in entries.values()]


def _write_atomic(path: Path, chunks: Sequence[bytes | memoryview]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "xb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
