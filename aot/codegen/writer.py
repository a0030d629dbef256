"""The indented line writer both code generators build their text with.

What it is: lines plus an indent depth; nested structure comes from ``indent()`` (Python) and ``block()``
(C's ``head {`` ... ``}``), so no generator builds a whole file from nested f-strings.
What it is not: a formatter. Each line is written as given, after the indent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class Writer:
    """Lines with an indent depth; ``unit`` is one level ("    " for Python, "  " for C++)."""

    def __init__(self, unit: str = "    ", depth: int = 0) -> None:
        self.unit = unit
        self.depth = depth
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        self.lines.append(self.unit * self.depth + text if text else "")

    def extend(self, lines: Iterable[str]) -> None:
        """Lines written elsewhere, taken as they are (they carry their own indent)."""
        self.lines += lines

    @contextmanager
    def indent(self, levels: int = 1) -> Iterator[None]:
        self.depth += levels
        try:
            yield
        finally:
            self.depth -= levels

    @contextmanager
    def block(self, head: str, tail: str = "}") -> Iterator[None]:
        """``head {``, the body one level in, then ``tail``."""
        self.line(head + " {")
        with self.indent():
            yield
        self.line(tail)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
