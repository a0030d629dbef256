"""The ``aotc`` click group: a bad flag is one line and exit 2, like every other refusal.

What it is: a ``click.Group`` whose ``main`` prints click's usage errors (unknown option, missing argument,
bad choice) as ``aotc CMD: error: ... (see aotc CMD -h)`` instead of click's three-line block, so that
scripts and users see one line for every refusal. Also ``refusals()`` and ``device_option``, shared by
the commands that live in their own modules (bench, doctor). What it is not: the commands.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from .errors import AotcError, UsageError

F = TypeVar("F", bound=Callable[..., Any])

_NO_ARGS: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


class Group(click.Group):
    def main(
        self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None, standalone_mode: bool = True, **extra: Any
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS as e:  # `aotc` or `aotc build` alone: the help
            click.echo(e.ctx.get_help() if e.ctx else "", err=False)
            sys.exit(0)
        except click.UsageError as e:
            cmd = e.ctx.command_path if e.ctx else "aotc"
            click.echo(f"{cmd}: error: {e.format_message()} (see {cmd} -h)", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"aotc: error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("aotc: aborted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


@contextmanager
def refusals() -> Iterator[None]:
    """Every ``AotcError`` as one line on stderr and its class's exit code (``aotc.errors``)."""
    try:
        yield
    except AotcError as e:
        click.echo(f"aotc: {type(e).__name__}: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("aotc: interrupted", err=True)
        sys.exit(130)  # what a shell reports for SIGINT


def trust_options(f: F) -> F:
    """``--trusted-key`` (repeatable; default: the files in $AOTC_TRUSTED_KEYS) and ``--require-signature``."""
    f = click.option(
        "--require-signature", is_flag=True,
        help="Refuse to start without trusted keys (fails closed where AOTC_TRUSTED_KEYS is unset).",
    )(f)  # fmt: skip
    return click.option(
        "--trusted-key", "trusted_key", multiple=True, envvar="AOTC_TRUSTED_KEYS", show_envvar=True,
        type=click.Path(dir_okay=False, path_type=str),
        help="A public key (.pub) the package must be signed by; repeatable, any one suffices.",
    )(f)  # fmt: skip


def trusted_keys(require: bool, keys: tuple[str, ...]) -> list[str] | None:
    """The keys ``aotc.load`` must check the package against (None: no check)."""
    if keys:
        return list(keys)
    if require:
        raise UsageError("--require-signature needs the keys to trust: --trusted-key KEY.pub, or AOTC_TRUSTED_KEYS")
    return None


def device_option(f: F) -> F:
    return click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")(f)
