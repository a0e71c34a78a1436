"""ModernBERT-base (all 22 layers, published sizes) on the strict simulator against transformers'
ModernBertModel in fp32 (eager), per hidden state (issue 7).

One simulator run per test returns every hidden state (modernbert.forward with
``output_hidden_states``, as HF's), so the same run gives the per-layer figures and the final output.
Targets: final cosine >= 0.9999 (over the whole output and per batch element) and the mean of
the per-layer cosines >= 0.99999; cosine and max relative error (max|ours - ref| / max|ref|)
of every hidden state are printed (run with -s). Padded positions carry no meaning
(modernbert.forward) and are left out.

Weights: models_testutil.seeded_params (norm scales 1 + N(0, 0.05), matrices N(0, 1/fan_in)),
loaded into HF's model, so both sides hold the same fp32 values.

Planted outliers (design.md convention 13), at T=128 and a padded batch of 3 -- a T=512 run
costs ~4x and adds nothing the plain 512 runs and these do not cover:
* a residual stream past 30000 (ModernBERT-large's passes 29000): one channel of the [CLS] and
  [SEP] embedding rows, times an embedding-norm gain of 1200, gives ~33000 in those rows and
  ~40 in that channel of every other row; the layers ignore that channel, as trained weights
  do (massive activations on delimiter tokens). Those rows' other channels are then squashed
  ~1000x by every LayerNorm, which only an accurate norm reproduces;
* LayerNorm gains of 10-50 on four channels of every MLP norm.
The test asserts that HF's hidden states carry them, so it cannot pass vacuously. Where a
channel is ~1000x the rest, a cosine over all channels measures that channel alone: the
per-layer cosine is taken over the ordinary channels, and every row's cosine over all channels
must stay >= ROW_COS.

The same compiled function is first called on ids without [CLS]/[SEP] (residual stream peak
~140), then on the planted ids (33216, >100x wider): the program must not depend on the first
call's data.

Measured (T=128 padded b3, 22 layers): final cosine 0.99998171 / 0.99997746 (planted ids /
first call), mean per-layer 0.99999334 / 0.99999293; (T=512 b1) final 0.99997819 / 0.99997780,
mean per-layer 0.99999180 / 0.99999204; both means must reach the target.

Where the error came from (fp32 JAX forwards on the planted ids that round to fp16 what the
NPU holds in fp16, mean per-layer cosine vs HF): the weights alone 0.9999969 (matrices
0.9999983, norm gains 0.9999990, embeddings 0.9999996), the residual stream alone 0.9999979,
the MLP intermediates 0.9999987; all of them together with q/k/v, scores, probabilities and
matmul outputs 0.9999929, against the program's 0.9999902 then. A residual stream kept in fp32
(residual adds on the host, tried) moved the program only to 0.9999913. The norm's separately
rounded gain (n * g in fp16, g itself in fp16) was the largest share: folding the gains into
the projections' weights (rockjit/lowering/gain_fold.py) took the program from 0.99999019 /
0.99998953 to the figures above. In the same kind of forward on the first call's ids, the fold
moves 0.9999926 (norm as the program computes it) to 0.9999961, and scores kept in fp32 before
the row max add nothing on top (0.9999958).

Known limits, measured, not tested here: gains of 10-50 on four channels of every *attention*
norm as well give final 0.99985 and mean 0.9999593 (the fp16-rounding forward, weights
kept fp32: 0.99993 / 0.9999789, under the mean target by itself); another draw of such gains
at T=128 b1 gave final 0.9952. Logits past 65504 / 8 overflow the fp16 q.k product before
its 1/8 scale and the call raises NumericsError.
"""
from __future__ import annotations

import os
import time
from functools import partial

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest
import torch
from models_testutil import seeded_params

import rockjit
from models import modernbert

pytestmark = [pytest.mark.reference, pytest.mark.slow]

FINAL_COS = 0.9999
MEAN_LAYER_COS = 0.99999
ROW_COS = 0.999

CLS, SEP = 50281, 50282       # answerdotai/ModernBERT-base's [CLS] and [SEP] ids
OUTLIER_CH = 5


def _hf_model(cfg: modernbert.ModernBertConfig, params: dict[str, np.ndarray]):
    from transformers import ModernBertModel
    from transformers.initialization import no_init_weights

    hf_cfg = cfg.to_hf()
    with no_init_weights():
        model = ModernBertModel(hf_cfg).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()}, strict=True)
    return model


def _hf_states(model, ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids).long(),
                    attention_mask=torch.from_numpy(mask).long(), output_hidden_states=True)
    states = [h.numpy() for h in out.hidden_states]
    # hidden_states ends with last_hidden_state (after final_norm), as ours does
    assert np.array_equal(states[-1], out.last_hidden_state.numpy())
    return states


def _inputs(cfg, lengths: list[int], seq: int, delimiters: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 50000, (len(lengths), seq)).astype(np.int32)
    mask = np.zeros((len(lengths), seq), np.int32)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = cfg.pad_token_id
        if delimiters:
            ids[b, 0], ids[b, n - 1] = CLS, SEP
    return ids, mask


def _plant_outliers(params: dict[str, np.ndarray], cfg) -> None:
    ch, d = OUTLIER_CH, cfg.hidden_size
    emb = params["embeddings.tok_embeddings.weight"]
    emb[:, ch] = 0.0
    emb[[CLS, SEP], ch] = 30.0                  # after the norm ~sqrt(D) in those rows ...
    params["embeddings.norm.weight"][ch] = 1200.0  # ... times 1200: ~33000
    g = np.random.default_rng(7)
    others = np.array([c for c in range(d) if c != ch])
    for i in range(cfg.num_hidden_layers):
        pre = f"layers.{i}."
        params[pre + "attn.Wqkv.weight"][:, ch] = 0.0    # trained weights ignore the channel
        params[pre + "mlp.Wi.weight"][:, ch] = 0.0
        params[pre + "attn.Wo.weight"][ch, :] = 0.0
        params[pre + "mlp.Wo.weight"][ch, :] = 0.0
        idx = g.choice(others, 4, replace=False)
        params[pre + "mlp_norm.weight"][idx] = 10.0 + 40.0 * g.random(4)   # gains 10-50


def _cos_rows(o: np.ndarray, r: np.ndarray) -> np.ndarray:
    return np.sum(o * r, axis=-1) / (np.linalg.norm(o, axis=-1) * np.linalg.norm(r, axis=-1))


def _cos(o: np.ndarray, r: np.ndarray) -> float:
    return float(o.ravel() @ r.ravel() / (np.linalg.norm(o) * np.linalg.norm(r)))


def _compare(label: str, ours: list[np.ndarray], refs: list[np.ndarray],
             mask: np.ndarray) -> dict[str, float]:
    """Per hidden state over the unpadded rows: cosine over the ordinary channels (those whose
    largest |value| is within 20x of the median channel's), max rel err and the worst row's
    cosine over all channels. Asserts finite values, every row's cosine and the final cosine
    (whole and per batch element); returns the figures (the mean per-layer target is the
    caller's)."""
    assert len(ours) == len(refs), (len(ours), len(refs))
    rows = mask != 0
    cos, rels = [], []
    for i, (o, r) in enumerate(zip(ours, refs)):
        assert o.shape == r.shape, (i, o.shape, r.shape)
        assert np.isfinite(o).all(), f"{label}: hidden state {i} has non-finite values"
        o, r = o[rows].astype(np.float64), r[rows].astype(np.float64)
        peak = np.abs(r).max(axis=0)
        keep = peak <= 20 * np.median(peak)
        c = _cos(o[:, keep], r[:, keep])
        rel = float(np.abs(o - r).max() / np.abs(r).max())
        rc = _cos_rows(o, r)
        worst = int(np.argmin(rc))
        cos.append(c)
        rels.append(rel)
        print(f"[{label}] hidden {i:2d}: max|ref| {np.abs(r).max():8.1f}  cos {c:.8f}"
              f"{f' (w/o {int((~keep).sum())} ch)' if not keep.all() else ''}  max rel err "
              f"{rel:.2e}  worst row cos {rc[worst]:.7f}")
        assert rc[worst] >= ROW_COS, f"{label}: hidden state {i}: a row's cosine {rc[worst]:.7f}"
    fig = {"final": cos[-1], "mean": float(np.mean(cos)), "worst": min(cos), "rel": max(rels)}
    print(f"[{label}] final cos {fig['final']:.8f}, per-layer cos mean {fig['mean']:.8f} worst "
          f"{fig['worst']:.8f}, max rel err {fig['rel']:.2e}")
    for b in range(mask.shape[0]):
        cb = _cos(ours[-1][b][rows[b]].astype(np.float64),
                  refs[-1][b][rows[b]].astype(np.float64))
        assert cb >= FINAL_COS, f"{label}: batch element {b}: final cosine {cb:.8f}"
    assert fig["final"] >= FINAL_COS, f"{label}: final cosine {fig['final']:.8f} < {FINAL_COS}"
    return fig


def _run(label: str, params, cfg, ids, mask, compiled=None, model=None):
    """Our hidden states on the simulator and HF's (``compiled`` / ``model`` reused when
    given)."""
    t0 = time.perf_counter()
    if compiled is None:
        compiled = rockjit.compile(partial(modernbert.forward, config=cfg,
                                           output_hidden_states=True),
                                   resident_argnums=0, backend="sim")
    ours = [np.asarray(o) for o in compiled(params, ids, mask)[1]]
    t1 = time.perf_counter()
    model = model or _hf_model(cfg, params)
    refs = _hf_states(model, ids, mask)
    print(f"\n[{label}] compile + simulator {t1 - t0:.1f} s, "
          f"HF fp32 {time.perf_counter() - t1:.1f} s")
    return compiled, model, ours, refs


@pytest.mark.parametrize("seq,lengths", [
    (128, [128]),
    (512, [512]),
    (512, [512, 300, 77]),
], ids=["T128_b1", "T512_b1", "T512_padded_b3"])
def test_modernbert_base_vs_hf(seq: int, lengths: list[int]) -> None:
    cfg = modernbert.ModernBertConfig()
    params = seeded_params(modernbert, cfg)
    ids, mask = _inputs(cfg, lengths, seq, delimiters=False)
    label = f"ModernBERT-base T={seq} b{len(lengths)} {'/'.join(map(str, lengths))}"
    _, _, ours, refs = _run(label, params, cfg, ids, mask)
    fig = _compare(label, ours, refs, mask)
    assert fig["mean"] >= MEAN_LAYER_COS, \
        f"{label}: mean per-layer cosine {fig['mean']:.8f} < {MEAN_LAYER_COS}"


@pytest.mark.parametrize("seq,lengths", [(128, [128, 90, 37]), (512, [512])],
                         ids=["T128_padded_b3", "T512_b1"])
def test_modernbert_base_outliers(seq: int, lengths: list[int]) -> None:
    cfg = modernbert.ModernBertConfig()
    params = seeded_params(modernbert, cfg)
    _plant_outliers(params, cfg)
    shape = f"T={seq} " + (f"padded b{len(lengths)} ({'/'.join(map(str, lengths))} tokens)"
                           if len(lengths) > 1 else "b1")
    plain_ids, mask = _inputs(cfg, lengths, seq, delimiters=False)
    label = f"ModernBERT-base outliers {shape}, first call without [CLS]/[SEP]"
    compiled, model, ours, refs = _run(label, params, cfg, plain_ids, mask)
    first_peak = max(float(np.abs(r[mask != 0]).max()) for r in refs[:-1])
    figs = [_compare(label, ours, refs, mask)]

    ids, _ = _inputs(cfg, lengths, seq, delimiters=True)
    label = f"ModernBERT-base outliers {shape}"
    _, _, ours, refs = _run(label, params, cfg, ids, mask, compiled, model)
    # the planted activations are there: a stream past 30000, >100x the first call's
    peak = max(float(np.abs(r[mask != 0]).max()) for r in refs[:-1])
    print(f"[{label}] residual stream peak {peak:.0f}, first call's {first_peak:.0f}")
    assert peak > 30000.0 and peak > 100 * first_peak, (peak, first_peak)
    figs.append(_compare(label, ours, refs, mask))
    for which, f in zip(("first call (no [CLS]/[SEP])", "planted ids"), figs):
        assert f["mean"] >= MEAN_LAYER_COS, \
            f"{which}: mean per-layer cosine {f['mean']:.8f} < {MEAN_LAYER_COS}"
