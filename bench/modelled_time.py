"""Modelled NPU time per forward (rockjit.cost) for SigLIP-B/16 at 224 and at 1024 tokens,
ModernBERT-base at 512 tokens and the Whisper-base encoder, with the model's buckets (dispatch,
DMA, MAC, host). MODELLED, not measured: no board runs here. Under each forward, the model's
own error band: the forward times the least and greatest published/modelled ratio of the
figures the model was not fitted on (rockjit.cost.calibrate.error_band), over those that run
fp16 or no MACs (the encoders run fp16) and over all of them. The published figures printed
beside SigLIP-1024 are other programs (the seeds' hand-written library, the vendor stack) and
are there for scale only.

    python bench/modelled_time.py [--model ...] [--extrapolate] [--contexts N]

``--contexts 1`` lays every program out for one core: no cross-core copies, every job on that
core. Beside the default three it shows what the copies buy.

The forward is the full-depth program; per layer comes from two reduced depths, and
--extrapolate takes the forward from them too (see _encoders.py).
"""
from __future__ import annotations

import argparse
import sys

from _encoders import ENCODERS, per_layer_and_forward

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from rockjit.cost import calibrated  # noqa: E402
from rockjit.cost.calibrate import error_band  # noqa: E402

PUBLISHED = {
    "siglip-1024": "published, other programs: seeds library 1.39-2.71 s warm at 600 MHz "
                   "(seeds/000 API reference + notes encodings/siglip-encoder.md), "
                   "vendor stack 1.195 s at 1 GHz (issue 9)",
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs="+", default=["siglip-224", "siglip-1024", "modernbert-512",
                                                   "whisper-base"], choices=sorted(ENCODERS))
    ap.add_argument("--extrapolate", action="store_true",
                    help="the forward from two reduced depths, not a full-depth compile "
                         "(quicker; not exact where a step runs once per forward)")
    ap.add_argument("--contexts", type=int, default=None,
                    help="lay the program out for N device contexts (cores) instead of the "
                         "profile's 3 (1: one core, no cross-core copies)")
    args = ap.parse_args()
    c = calibrated()
    print(f"cost model constants: submit {c.submit_us:.1f} us, job {c.job_us:.1f} us, kick "
          f"{c.kick_us:.1f} us, CBUF fill {c.fill_us:.1f} us per task, DMA {c.dma_gbps:.2f} GB/s "
          f"per core, host gather "
          f"{c.host_gather_gbps:.2f} GB/s, copy {c.host_copy_gbps:.1f} GB/s; stock kernel")
    rows = []
    for m in args.model:
        enc = ENCODERS[m]
        per, fwd, how = per_layer_and_forward(enc, not args.extrapolate, log=lambda s: print(s, file=sys.stderr),
                                              contexts=args.contexts)
        rows.append((m, enc, per, fwd, how))
    lo16, hi16 = error_band("fp16")
    lo, hi = error_band()
    where = f", laid out for {args.contexts} context(s)" if args.contexts else ""
    print(f"\nMODELLED ms per forward at 600 MHz (rockjit.cost{where})")
    print(f"{'':46s}{'modelled':>10s}{'dispatch':>10s}{'dma':>10s}{'mac':>10s}{'host':>10s}"
          f"{'steps':>8s}{'kicks':>8s}")
    for m, enc, per, fwd, how in rows:
        for tag, s in (("per layer", per), ("per forward", fwd)):
            print(f"{enc.name + ', ' + tag:46s}{s['modelled_ms']:10.2f}"
                  f"{s['modelled_dispatch_ms']:10.2f}{s['modelled_dma_ms']:10.2f}"
                  f"{s['modelled_mac_ms']:10.2f}{s['modelled_host_ms']:10.2f}"
                  f"{s['npu_steps'] + s['host_steps']:8.0f}{s['kicks']:8.0f}")
        print(f"{'':46s}({how})")
        t = fwd["modelled_ms"]
        print(f"{'':46s}error band: {t * lo16:.1f}-{t * hi16:.1f} ms (held-out fp16 and dispatch "
              f"figures, x{lo16:.2f}-{hi16:.2f}); {t * lo:.1f}-{t * hi:.1f} ms (all held-out, "
              f"x{lo:.2f}-{hi:.2f})")
        if m in PUBLISHED:
            print(f"{'':46s}[{PUBLISHED[m]}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
