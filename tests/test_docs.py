"""The README's and docs/'s commands and code still work.

Every ``aotc ...`` line in the README and docs/*.md must parse against the real CLI (its command and
flags exist, values of the right kind). The ``$ aotc ...`` lines of docs/*.md then run, in order, in a
folder holding ``mlp.pkg`` and ``classifier.pkg`` built once from examples/, and must exit 0 (or the code a trailing
``# exit N`` names); ``aotc build`` lines only parse (the one build here proves building). Python blocks
of docs/ run there too; the README's compile (they name packages this test does not build)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import click
import numpy as np
import pytest
from aotc.cli import cli
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
OPTIONAL_ENGINES = {"ray", "triton_python_backend_utils"}
_EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def commands(page: Path) -> list[tuple[str, int]]:
    """``aotc`` command lines with the exit code they document: ``$ `` lines of console blocks, and in the
    README also the indented lines that start with ``aotc``."""
    text = page.read_text()
    lines = [ln[2:] for block in _blocks(text, "console") for ln in block.splitlines() if ln.startswith("$ ")]
    if page.name == "README.md" and page.parent == ROOT:
        lines += [ln.strip() for ln in text.splitlines() if ln.startswith("    aotc ")]
    out = []
    for line in lines:
        m = _EXIT.search(line)
        cmd = re.sub(r"\s+#.*$", "", _EXIT.sub("", line))
        if cmd.startswith("aotc "):
            out.append((cmd, int(m.group(1)) if m else 0))
    return out


ALL = [(page.relative_to(ROOT).as_posix(), cmd) for page in PAGES for cmd, _ in commands(page)]


def test_every_page_has_commands() -> None:
    for page in DOCS:
        if page.name not in ("ops.md", "README.md", "safety.md"):  # safety.md: the threat model, no commands
            assert commands(page), page


@pytest.mark.parametrize(("page", "cmd"), ALL, ids=[f"{p}: {c}" for p, c in ALL])
def test_command_parses(page: str, cmd: str) -> None:
    args = shlex.split(cmd)[1:]
    if args[0].startswith("-") or "--help" in args:  # aotc --version / --help, aotc CMD --help
        assert CliRunner().invoke(cli, args).exit_code == 0
        return
    sub = cli.get_command(click.Context(cli), args[0])
    assert sub is not None, f"{page}: no command {args[0]!r}"
    sub.make_context(args[0], args[1:])  # raises on an unknown flag or a bad value


def test_python_blocks_compile() -> None:
    for page in PAGES:
        for i, block in enumerate(_blocks(page.read_text(), "python")):
            compile(block, f"{page.name}[python {i}]", "exec")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, aotc_cache: Path) -> Path:
    d = tmp_path_factory.mktemp("docs")
    (d / "examples").symlink_to(ROOT / "examples")
    np.save(d / "x.npy", np.random.default_rng(0).standard_normal((4, 256), dtype=np.float32))
    np.save(d / "wrong.npy", np.zeros((4, 100), np.float32))
    np.save(d / "x64.npy", np.ones((4, 256)))  # float64: refused without --cast
    old, env = Path.cwd(), os.environ.get("AOTC_CACHE_DIR")
    os.chdir(d)
    os.environ["AOTC_CACHE_DIR"] = str(aotc_cache)
    try:
        for name in ("mlp", "classifier"):  # classifier: forward() returns a dict (docs/python-api.md)
            r = CliRunner().invoke(cli, ["build", f"examples/{name}.py", "-o", f"{name}.pkg", "--quiet"])
            assert r.exit_code == 0, r.output
    finally:
        os.chdir(old)
        if env is None:
            os.environ.pop("AOTC_CACHE_DIR", None)
        else:
            os.environ["AOTC_CACHE_DIR"] = env
    return d


RUNNABLE = [(p.name, cmd, code) for p in DOCS for cmd, code in commands(p) if not cmd.startswith("aotc build")]


@pytest.mark.parametrize(("page", "cmd", "code"), RUNNABLE, ids=[f"{p}: {c}" for p, c, _ in RUNNABLE])
def test_docs_command_runs(workdir: Path, monkeypatch: pytest.MonkeyPatch, page: str, cmd: str, code: int) -> None:
    monkeypatch.chdir(workdir)
    r = CliRunner().invoke(cli, shlex.split(cmd)[1:])
    assert r.exit_code == code, f"{page}: {cmd}\n{r.output}"
    assert "Traceback" not in r.output


def test_docs_python_blocks_run(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    for page in DOCS:
        for block in _blocks(page.read_text(), "python"):
            try:
                exec(compile(block, page.name, "exec"), {})
            except ModuleNotFoundError as e:  # an engine aotc serves on (Ray, Triton) but does not install
                if e.name not in OPTIONAL_ENGINES:
                    raise


def _dataclasses_of_the_manifest() -> dict[str, type]:
    """Manifest and every dataclass reachable through its fields' types."""
    import dataclasses
    import typing

    from aotc import schema

    seen: dict[str, type] = {}
    todo: list[type] = [schema.Manifest]
    while todo:
        cls = todo.pop()
        if cls.__name__ in seen:
            continue
        seen[cls.__name__] = cls
        for hint in typing.get_type_hints(cls).values():
            stack = [hint]
            while stack:
                t = stack.pop()
                if dataclasses.is_dataclass(t) and isinstance(t, type):
                    todo.append(t)
                stack.extend(typing.get_args(t))
    return seen


def _documented_fields(text: str) -> dict[str, dict[str, str]]:
    """``### `Class``` sections of docs/format.md: each table row's field name and type, as written."""
    out: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"^### `(\w+)`\n(.*?)(?=^#|\Z)", text, flags=re.S | re.M):
        rows = re.findall(r"^\| `(\w+)` \| `(.*?)` \| ", m.group(2).replace("\\|", "\x00"), flags=re.M)
        out[m.group(1)] = {name: t.replace("\x00", "|") for name, t in rows}
    return out


def test_format_doc_matches_the_schema() -> None:
    """docs/format.md documents every manifest dataclass and field with its type, and nothing else."""
    import dataclasses

    from aotc import schema

    doc = _documented_fields((ROOT / "docs" / "format.md").read_text())
    code = {
        name: {f.name: str(f.type) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for name, cls in _dataclasses_of_the_manifest().items()
    }
    assert sorted(doc) == sorted(code), "dataclasses documented vs in aotc.schema"
    for name, fields in code.items():
        assert doc[name] == fields, f"docs/format.md, {name}: fields and types differ from aotc.schema"
    assert f"(format version {schema.FORMAT_VERSION})" in (ROOT / "docs" / "format.md").read_text()


class _Fn:
    """Modules around aot/torch_calls.py's functions (built lazily: torch is imported only here)."""

    @staticmethod
    def make(fn):  # type: ignore[no-untyped-def]
        import torch

        class Fn(torch.nn.Module):
            def forward(self, x):  # type: ignore[no-untyped-def]
                return fn(x)

        return Fn()

    @staticmethod
    def make_all(fns):  # type: ignore[no-untyped-def]
        """One module calling every function on the same input, function i as submodule ``calls.i``: one
        export for all of them (an export costs ~0.5 s), each node still traceable to its call."""
        import torch

        class All(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.calls = torch.nn.ModuleList(_Fn.make(f) for f in fns)

            def forward(self, x):  # type: ignore[no-untyped-def]
                return tuple(m(x) for m in self.calls)

        return All()


def _aten_ops(nodes) -> set[str]:  # type: ignore[no-untyped-def]
    return {str(n.target).removeprefix("aten.") for n in nodes if n.op == "call_function"}


def _ops_by_call(cap) -> dict[int, set[str]]:  # type: ignore[no-untyped-def]
    """The aten ops of a ``_Fn.make_all`` export, by function number (from each node's module stack)."""
    by: dict[int, list] = {}
    for n in cap.program.graph.nodes:
        if n.op == "call_function":
            paths = [p for p, _ in (n.meta.get("nn_module_stack") or {}).values() if p.startswith("calls.")]
            assert paths, f"node {n} came from no call's module"
            by.setdefault(int(paths[0].split(".")[1]), []).append(n)
    return {i: _aten_ops(nodes) for i, nodes in by.items()}


@pytest.mark.slow
def test_torch_calls_lower_as_docs_ops_says() -> None:
    """Every torch call docs/ops.md lists by name exports to the aten ops it lists and lowers; every call it
    lists as not lowered yet still fails with UnsupportedOp (adding an op moves its row). The lowered calls
    are exported together, once; the not-lowered ones one by one (each must fail on its own)."""
    import torch
    from aotc.errors import UnsupportedOp
    from aotc_build.capture import capture_module
    from aotc_build.lower.driver import lower_program
    from aotc_build.torch_calls import CALLS, NOT_YET

    x = torch.randn(2, 8, 16)
    cap = capture_module(_Fn.make_all([c.fn for c in CALLS]), (x,))
    ops = _ops_by_call(cap)
    for i, c in enumerate(CALLS):
        missing = set(c.ops) - ops.get(i, set())
        assert not missing, f"{c.call}: exports to {sorted(ops.get(i, set()))}, not {sorted(missing)}"
    try:
        lower_program(cap)
    except Exception:
        for c in CALLS:  # name the call that does not lower
            try:
                lower_program(capture_module(_Fn.make(c.fn), (x,)))
            except Exception as e:
                raise AssertionError(f"{c.call} does not lower: {e}") from e
        raise
    for c in NOT_YET:
        with pytest.raises(UnsupportedOp):
            lower_program(capture_module(_Fn.make(c.fn), (x,)))
