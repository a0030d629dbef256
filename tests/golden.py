"""Golden text files: printed IR and generated code, compared byte for byte.

A missing golden file is a failure, not a silent pass. ``UPDATE_GOLDEN=1 pytest ...`` writes (or rewrites) the
files; read the diff, it is the review of the change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"golden file {path} is missing; create it with UPDATE_GOLDEN=1 and review it")
    assert text == path.read_text(), f"{name} changed; rerun with UPDATE_GOLDEN=1 if intended and review the diff"
