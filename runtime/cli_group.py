"""The ``aotc`` click group: a bad flag is one line and exit 2, like every other refusal.

What it is: a ``click.Group`` whose ``main`` prints click's usage errors (unknown option, missing argument,
bad choice) as ``aotc CMD: error: ... (see aotc CMD -h)`` instead of click's three-line block, so that
scripts and users see one line for every refusal. What it is not: the commands (``cli.py`` and the modules
each new command lives in).
"""

from __future__ import annotations

import sys
from typing import Any

import click

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
