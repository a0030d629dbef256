"""Which front end reads a model file: ONNX or a model.py, told apart by content.

What it is not: a reader; it imports nothing heavier than the standard library, so building a model.py
never loads the onnx package.
"""

from __future__ import annotations

from pathlib import Path


def looks_like_onnx(path: Path) -> bool:
    """Whether the file holds an ONNX model, judged by its content: protobuf writes fields in field-number
    order and a ModelProto's first field is ir_version (field 1, a varint: tag byte 0x08), which no Python
    source starts with. An ``.onnx`` file that is not text (a damaged model) counts too, so it gets the
    ONNX reader's error rather than Python's."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if head[:1] == b"\x08":
        return True
    if path.suffix.lower() != ".onnx":
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return not head  # an empty .onnx file
