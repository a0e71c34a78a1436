"""``rockjit check`` (rockjit/check.py, rockjit/cli/check.py): per-group accuracy against the
fp32 interpreter, from Python and from the CLI, text and HTML; a planted defect (a LUT domain
that is too narrow, the bug this issue removed) is found in the group that has it."""
from __future__ import annotations

import html.parser
from functools import partial

import jax
import numpy as np
import pytest

import rockjit
from check_targets import params as mlp_params
from check_targets import three_lines
from models.weights import seeded_weights
from rockjit.cli import main as cli_main
from rockjit.lowering import calibrate


def _cos(a, b) -> float:
    a, b = np.ravel(np.asarray(a, np.float64)), np.ravel(np.asarray(b, np.float64))
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def whisper2():
    from models import whisper

    cfg = whisper.WhisperEncoderConfig(d_model=64, encoder_layers=2, encoder_attention_heads=2,
                                       encoder_ffn_dim=128, max_source_positions=16)
    p = seeded_weights(whisper.expected_shapes(cfg))
    x = np.random.default_rng(0).standard_normal((1, 80, 32)).astype(np.float32)
    fn = partial(whisper.forward, config=cfg)
    c = rockjit.compile(fn, resident_argnums=0, backend="sim").lower(p, x).compile()
    return fn, c, p, x


def test_encoder_groups_are_the_residual_stream(whisper2) -> None:
    """Two layers: the conv stem, attention and MLP of each layer (cut where a LayerNorm
    reads the residual stream), and the final norm; every group passes, and the last group
    is the function's output, checked against JAX on the CPU."""
    fn, c, p, x = whisper2
    rep = c.check(p, x)
    assert rep.by == "norm"
    names = [g.name for g in rep.groups]
    assert len(names) == 6, names
    assert names[1].startswith("models/whisper.py:") and names[1].endswith("[0]")
    assert names[3] == names[1].replace("[0]", "[1]")          # layer 1's attention residual
    assert rep.first_under is None
    assert all(g.cosine >= rep.threshold and g.max_rel_err < 5e-3 for g in rep.groups)
    want = np.asarray(jax.jit(fn)(p, x))
    got = c(p, x)
    last = rep.groups[-1]
    assert last.cosine == pytest.approx(_cos(got, want), abs=1e-6)
    assert last.ref_range == pytest.approx((want.min(), want.max()), rel=1e-4)
    assert last.npu_range == pytest.approx((got.min(), got.max()), rel=1e-6)
    text = str(rep)
    # every group shows what the range plan did for its values
    assert "first group under the threshold: none" in text and "value bound" in text


def test_planted_defect_is_named_in_its_group(monkeypatch) -> None:
    """sigmoid's table squeezed to [-0.5, 0.5]: the sigmoid line's group is the first under
    the threshold; the tanh line before it still passes."""
    p = mlp_params()
    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    real = calibrate.lut_domain
    monkeypatch.setattr(calibrate, "lut_domain",
                        lambda kind, ms=False: (-0.5, 0.5) if kind == "sigmoid" else real(kind, ms))
    c = rockjit.compile(three_lines, resident_argnums=0, backend="sim").lower(p, x).compile()
    rep = c.check(p, x, by="line")
    bad = rep.first_under
    assert bad is not None
    assert any(n.op.text == "logistic" for n in bad.nodes), bad.name
    assert bad.name.startswith("numerics/check_targets.py:")
    before = rep.groups[:bad.index]
    assert before and all(g.cosine >= rep.threshold for g in before)
    assert f"first group under the threshold: {bad.index} {bad.name}" in str(rep)


def test_range_plan_records_are_reported_per_group(whisper2, monkeypatch) -> None:
    fn, c, p, x = whisper2

    class Rec:
        def __init__(self, value, action, bound):
            self.value, self.action, self.bound = value, action, bound
            self.op, self.loc = "x", "here"

    from rockjit.check import make_groups

    prog = c._runner.load()      # loaded on first use: this test may run alone
    groups, _ = make_groups(c.graph)
    v = groups[2].value.id
    recs = [Rec(v, "prescale 2^-4", 123.0), Rec(groups[2].nodes[0].out.id, "fp16", 9.0)]
    monkeypatch.setattr(type(prog), "range_plan", property(lambda self: recs), raising=False)
    rep = c.check(p, x)
    assert rep.plan_available
    assert "prescale 2^-4 x1" in rep.groups[2].range_plan
    assert "value bound 123" in rep.groups[2].range_plan
    assert rep.groups[0].range_plan == "no records"


def test_html_page_is_self_contained_with_an_svg_plot(whisper2) -> None:
    fn, c, p, x = whisper2
    page = c.check(p, x).html()

    class Collect(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.refs = [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.refs += [v for k, v in attrs if k in ("src", "href") and v]

    h = Collect()
    h.feed(page)
    assert "svg" in h.tags and h.tags.count("polyline") == 2 and "table" in h.tags
    assert h.refs == [], "no external assets"
    assert page.count("<tr") == 1 + 6


def _cli(capsys, *argv) -> tuple[int, str]:
    rc = cli_main(list(argv))
    return rc, capsys.readouterr().out


def test_cli_check_text_and_html(tmp_path, capsys) -> None:
    out = tmp_path / "r.html"
    rc, text = _cli(capsys, "check", "check_targets:three_lines_spec", "rows=8", "--html",
                    str(out))
    assert rc == 0, text
    assert "by line" in text and "first group under the threshold: none" in text
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_cli_check_exit_status_names_the_defect(capsys, monkeypatch) -> None:
    real = calibrate.lut_domain
    monkeypatch.setattr(calibrate, "lut_domain",
                        lambda kind, ms=False: (-0.5, 0.5) if kind == "sigmoid" else real(kind, ms))
    rc, text = _cli(capsys, "check", "check_targets:three_lines_spec")
    assert rc == 3
    last = text.strip().splitlines()[-1]
    assert last.startswith("first group under the threshold: ") and "check_targets.py:" in last


def test_cli_check_usage_errors(capsys) -> None:
    assert cli_main(["check", "check_targets:three_lines_spec", "--threshold", "2"]) == 2
    assert cli_main(["check", "no_such_module_xyz:spec"]) == 2


def test_check_refuses_a_nan_input_naming_it() -> None:
    p = mlp_params()
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
    c = rockjit.compile(three_lines, resident_argnums=0, backend="sim").lower(p, x).compile()
    x[0, 1] = np.nan
    with pytest.raises(rockjit.InputRangeError, match=r"argument 1 \('x'\).*\[0, 1\]"):
        c.check(p, x)
