"""``python -m aotc`` and the ``aotc`` command's entry point.

What it is: a guard around importing the CLI (numpy, click), so that Ctrl-C while the command starts ends
in one line and exit 130, like Ctrl-C later on (``aotc.cli.main``).
What it is not: the CLI; that is ``aotc.cli``.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("aotc: interrupted\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
