"""``aotc build``'s flag and path checks, run before torch is imported and before anything is captured.

What it is: plain-Python checks of the output path, ``--dynamic`` specs, ``--keep-sources`` and the model
file's syntax, each refusal one ``UsageError`` line (exit 2) that names the flag and the fix.
What it is not: checks that need the model (an input name or an axis beyond the example's rank); those run
in ``capture.parse_dynamic`` once the example inputs exist. No torch import here, so a typo costs no start-up.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aotc.errors import UsageError

_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class DynamicSpec:
    """One ``--dynamic INPUT:AXIS:LABEL[:MIN:MAX]``; ``max`` None means unbounded."""

    input: str
    axis: int
    label: str
    min: int
    max: int | None


def parse_dynamic_spec(text: str) -> DynamicSpec:
    parts = text.split(":")
    form = "use INPUT:AXIS:LABEL or INPUT:AXIS:LABEL:MIN:MAX, e.g. x:0:batch:1:64"
    if len(parts) not in (3, 5):
        raise UsageError(f"--dynamic {text!r}: {form}")
    name, axis, label = parts[:3]
    if not name:
        raise UsageError(f"--dynamic {text!r}: the input name is empty; {form}")
    if not axis.isdigit():
        raise UsageError(f"--dynamic {text!r}: the axis {axis!r} is not a non-negative integer; {form}")
    if not _LABEL.match(label):
        raise UsageError(f"--dynamic {text!r}: the label {label!r} is not an identifier (letters, digits, _); {form}")
    lo, hi = 1, None
    if len(parts) == 5:
        if not parts[3].isdigit() or not parts[4].isdigit():
            raise UsageError(f"--dynamic {text!r}: MIN and MAX must be non-negative integers; {form}")
        lo, hi = int(parts[3]), int(parts[4])
        if lo > hi:
            raise UsageError(f"--dynamic {text!r}: MIN {lo} is greater than MAX {hi}; swap them")
        if hi < 2:
            raise UsageError(f"--dynamic {text!r}: MAX {hi} leaves nothing dynamic (torch.export needs MAX >= 2)")
    return DynamicSpec(name, int(axis), label, lo, hi)


def check_dynamic(specs: tuple[str, ...]) -> list[DynamicSpec]:
    out = [parse_dynamic_spec(s) for s in specs]
    seen: dict[tuple[str, int], str] = {}
    for s, text in zip(out, specs, strict=True):
        if (s.input, s.axis) in seen:
            raise UsageError(f"--dynamic {text!r}: axis {s.axis} of {s.input!r} is already declared by {seen[(s.input, s.axis)]!r}")
        seen[(s.input, s.axis)] = text
    return out


def check_output(out: Path) -> None:
    """The package path can be written: not a directory, its nearest existing ancestor a writable directory."""
    if out.is_dir():
        raise UsageError(f"-o {out}: is a directory; pass a file path such as {out / 'model.pkg'}")
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"-o {out}: the file exists and is not writable; pick another path or fix its permissions")
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"-o {out}: {parent} is a file, not a directory; pick another output path")
    try:  # a real probe: os.access says yes to root on read-only file systems and /sys
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        raise UsageError(f"-o {out}: cannot create files in {parent} ({e.strerror}); pick a writable directory") from None


def check_sources_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise UsageError(f"--keep-sources {path}: is a file; pass a directory (it is created if missing)")
    check_output(path / "probe")


def check_model_file(path: Path) -> None:
    """The model file exists, is Python, and parses: a syntax error is the user's to fix (exit 2), shown with
    its caret, before torch is imported."""
    if not path.exists():
        raise UsageError(f"{path}: no such file; pass the path of a model.py")
    if not path.is_file():
        raise UsageError(f"{path}: is a directory; pass the path of a model.py")
    if path.suffix == ".onnx":  # the ONNX front end reads and checks it
        return
    if path.suffix != ".py":
        raise UsageError(f"{path}: not a .py (or .onnx) file; `aotc build` takes a model.py that defines `model` and `example_inputs`")
    try:
        source = path.read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror})") from None
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as e:
        raise UsageError(syntax_message(path, e)) from None
    except ValueError as e:  # null bytes
        raise UsageError(f"{path}: not a Python source file ({e})") from None


def syntax_message(path: Path, e: SyntaxError) -> str:
    where = f"{path}:{e.lineno}" + (f":{e.offset}" if e.offset else "")
    msg = f"{where}: {type(e).__name__}: {e.msg}"
    if e.text:
        line = e.text.rstrip("\n")
        stripped = line.lstrip()
        caret = max((e.offset or 1) - 1 - (len(line) - len(stripped)), 0)
        msg += f"\n    {stripped}\n    {' ' * caret}^"
    return msg
