"""Core ATen -> aotc IR (``lower_program``), and the lowering table it applies (``TABLE``, ``IGNORED``).

What it is not: the rules or the driver themselves; see ``table.py``, ``elementwise.py``, ``movement.py``,
``nn.py`` and ``driver.py``.
"""

from .driver import IGNORED, TABLE, lower_program

__all__ = ["IGNORED", "TABLE", "lower_program"]
