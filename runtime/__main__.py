"""``python -m aotc`` and the ``aotc`` command's entry point.

What it is: a guard around importing the CLI (numpy, click), so that Ctrl-C while the command starts ends
in one line and exit 130, like Ctrl-C later on (``aotc.cli.main``); and numpy's OpenBLAS kept to one thread.
What it is not: the CLI; that is ``aotc.cli``.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    # numpy's OpenBLAS (pip's numpy) starts a worker thread per core at import, which spins for ~0.1 s:
    # 30-80 ms of every `aotc run` on a 2-core server, and a core taken from the model meanwhile. aotc never
    # calls numpy's BLAS (the package's library does the math; the builder's is torch's), so one thread.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("aotc: interrupted\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
