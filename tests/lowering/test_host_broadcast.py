"""A host element-wise op reads a broadcast operand through a stride-0 view of its source
(lowering/host_broadcast.py): the replicated tensor is never written. Checked against numpy,
for a per-row and a per-column operand and both operand orders."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit


CASES = {
    "x ** s[row]": (lambda x, s: jnp.power(x, s[:, None]), lambda x, s: x ** s[:, None], 64),
    "s[col] ** x": (lambda x, s: jnp.power(s[None, :], x), lambda x, s: s[None, :] ** x, 48),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_broadcast_operand_read_in_place(case: str) -> None:
    fn, ref, n = CASES[case]
    rng = np.random.default_rng(7)
    x = rng.uniform(0.5, 2.0, (64, 48)).astype(np.float32)
    s = rng.uniform(0.5, 2.0, n).astype(np.float32)
    f = rockjit.compile(fn, backend="sim")
    got = np.asarray(f(x, s), np.float64)
    want = ref(x.astype(np.float64), s.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-6)
    rep = f.compiled(x, s)._runner.report()
    line = next(ln for ln in rep.splitlines() if "= pow" in ln)
    assert " host " in line and "broadcast read in place" in line, rep
    assert not [ln for ln in rep.splitlines() if "= broadcast_in_dim" in ln and " host " in ln]
