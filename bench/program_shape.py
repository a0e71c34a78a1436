"""Program shape per encoder: NPU steps, jobs, kicks, host steps, host bytes (packs, unpacks and
cross-core copies; "copied MB" the copies alone), retiles, device and useful MACs, per layer and per forward (rockjit.compile on the ``null`` backend: lowering and
program build only; the counts are the program's own Program.stats()).

    python bench/program_shape.py [--model siglip-224 modernbert-512 ...] [--extrapolate]
                                  [--contexts N]

Default: every encoder of bench/_encoders.py except whisper-tiny; per layer from two reduced
depths, the forward lowered at full depth (--extrapolate: from the two depths, see
_encoders.py).
"""
from __future__ import annotations

import argparse
import sys

from _encoders import ENCODERS, per_layer_and_forward

COLS = [("npu_steps", "NPU steps"), ("jobs", "jobs"), ("kicks", "kicks"), ("tasks", "tasks"),
        ("host_steps", "host steps"), ("host_bytes", "host MB"), ("copied", "copied MB"),
        ("retiles", "retiles"),
        ("device_macs", "device GMAC"), ("macs", "useful GMAC")]


def row(s: dict) -> list[str]:
    host = s["host_bytes_packed"] + s["host_bytes_unpacked"] + s["host_bytes_copied"]
    vals = {**s, "host_bytes": host / 1e6, "copied": s["host_bytes_copied"] / 1e6,
            "device_macs": s["device_macs"] / 1e9,
            "macs": s["macs"] / 1e9}
    out = []
    for k, _ in COLS:
        v = vals[k]
        out.append(f"{v:.3f}" if k in ("host_bytes", "copied", "device_macs", "macs") else f"{v:.1f}"
                   if v != int(v) else f"{int(v)}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs="+", default=["siglip-224", "siglip-1024", "modernbert-512",
                                                   "whisper-base"], choices=sorted(ENCODERS))
    ap.add_argument("--extrapolate", action="store_true",
                    help="the forward from two reduced depths, not a full-depth compile "
                         "(quicker; not exact where a step runs once per forward)")
    ap.add_argument("--contexts", type=int, default=None,
                    help="lay the program out for N device contexts (cores) instead of the "
                         "profile's 3; 1: no job spreads over cores, no cross-core copies")
    args = ap.parse_args()
    header = f"{'':46s}" + "".join(f"{h:>12s}" for _, h in COLS)
    results = []
    for m in args.model:
        enc = ENCODERS[m]
        per, fwd, how = per_layer_and_forward(enc, not args.extrapolate,
                                              log=lambda s: print(s, file=sys.stderr),
                                              contexts=args.contexts)
        results.append((enc, per, fwd, how))
    where = f", laid out for {args.contexts} context(s)" if args.contexts else ""
    print(f"program shape (rockjit Program.stats(), null backend{where})")
    print(header)
    for enc, per, fwd, how in results:
        print(f"{enc.name + ', per layer':46s}" + "".join(f"{v:>12s}" for v in row(per)))
        print(f"{enc.name + ', per forward':46s}" + "".join(f"{v:>12s}" for v in row(fwd)))
        print(f"{'':46s}({how}; useful/device MACs {fwd['macs'] / max(1, fwd['device_macs']):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
