"""Every elementwise IR op has its meaning and both back ends' code: the rows docs/adding-an-op.md says a
new op needs (route 2), so a missing one fails here, naming the table, before any model test does."""

from __future__ import annotations

import pytest
from aotc_build import interp
from aotc_build.codegen import cpp_values
from aotc_build.codegen.triton import values as triton_values
from aotc_build.ir import Family, Op

SPECIAL = {Op.CAST}  # a cast is the builder's and each back end's own (dtype pairs), not a table row


@pytest.mark.parametrize("family", ["UNARY", "BINARY"])
def test_every_elementwise_op_has_a_row_in_each_table(family: str) -> None:
    ops = getattr(Family, family) - SPECIAL
    for where, module in (("aot/interp.py", interp), ("aot/codegen/cpp_values.py", cpp_values),
                          ("aot/codegen/triton/values.py", triton_values)):  # fmt: skip
        missing = sorted(o.name for o in ops - set(getattr(module, family)))
        assert not missing, f"{where} {family} has no row for {', '.join(missing)} (docs/adding-an-op.md, route 2)"
