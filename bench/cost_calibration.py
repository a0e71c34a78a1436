"""The cost model's calibration: its constants, and every published figure described in the
model's terms (submits, jobs, kicks, tasks, MACs, DMA and host bytes) with the published time,
the MODELLED time and their ratio; which figure fitted which constant, which were held out.

    python bench/cost_calibration.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rockjit.cost import calibrated  # noqa: E402
from rockjit.cost.calibrate import _program, modelled_ms  # noqa: E402
from rockjit.cost.published import FIGURES  # noqa: E402


def main() -> int:
    c = calibrated()
    print("constants (fitted on the figures marked 'fit', cited otherwise):")
    print(f"  submit_us {c.submit_us:8.2f}   job_us {c.job_us:8.2f}   kick_us {c.kick_us:8.2f}   "
          f"dma_gbps {c.dma_gbps:6.3f} per core   fill_us {c.fill_us:8.2f}")
    print(f"  host_gather_gbps {c.host_gather_gbps:.3f}  host_copy_gbps {c.host_copy_gbps:.1f}  "
          f"MACs/cycle/core {c.macs_per_cycle}")
    print(f"\n{'figure':48s}{'subm':>5s}{'jobs':>5s}{'kicks':>6s}{'tasks':>6s}{'GMAC':>7s}"
          f"{'DMA MB':>8s}{'host MB':>8s}{'published':>11s}{'modelled':>10s}{'ratio':>7s}  role")
    for f in FIGURES:
        n = _program(f).counts()
        macs = sum(v for k, v in n.items() if k.startswith("macs_")) / 1e9
        m = modelled_ms(f, c)
        role = f"fit {f.fits}" if f.fits else "held out"
        print(f"{f.name:48s}{n['submits']:5d}{n['jobs']:5d}{n['kicks']:6d}{n['tasks']:6d}"
              f"{macs:7.2f}{n['dma_bytes'] / 1e6:8.1f}{n['host_bytes'] / 1e6:8.1f}"
              f"{f.ms:9.3f}ms{m:8.3f}ms{m / f.ms:7.2f}  {role}")
    print("\n(modelled = rockjit.cost's estimate; sources per figure in rockjit/cost/published.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
