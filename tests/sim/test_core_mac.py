"""The CORE MAC kernels (AVX-512 when the host has it, AVX2, portable) against a plain loop."""
from __future__ import annotations

from rockjit._rjc import lib


def test_mac_kernels_match_plain_loop_on_edge_shapes() -> None:
    # 0 = every kernel path reproduced the exact sums on shapes with partial row blocks,
    # partial/odd weight panels and K spanning several cache blocks; n > 0 names the shape
    assert lib.rj_sim_mac_selftest() == 0
