"""Fuzzing the three readers of untrusted bytes (issue 10), each >= 500 hypothesis examples:

* the IR text parser: random and mutated programs give a clean IRSyntaxError with a line and
  column, never another exception;
* the safetensors weight loader (models/weights.py): truncations, bad headers, wrong dtypes give
  a WeightError naming the file, never a raw safetensors/JSON/numpy error;
* the simulator's regcmd decoder: random task words give a clean RJ_E* error (a RuntimeCError
  subclass with a message) or run, never a crash. The same fuzz runs under ASan+UBSan through
  `make -C csrc asan-fuzz` (test_regcmd_fuzz_under_asan).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.numpy import save_file

import rockjit
from models.weights import load_safetensors
from rockjit.errors import IRSyntaxError, WeightError
from rockjit.ir.parser import parse
from rockjit.ir.printer import print_graph

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("RJ_FUZZ_EXAMPLES", "500"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- the IR text parser -----------------------------------------------------------------------

def _load_graphgen():
    spec = importlib.util.spec_from_file_location("ir_graphgen", REPO / "tests/ir/ir_graphgen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _traced_corpus() -> list[str]:
    x = jax.ShapeDtypeStruct((4, 8), np.float32)
    fns = [lambda a: jax.nn.gelu(a @ a.T) + 1.0,
           lambda a: jnp.where(a > 0, jnp.exp(a), a * 0.5).sum(axis=-1),
           lambda a: jax.nn.softmax(a, axis=-1).reshape(8, 4)[:3]]
    return [rockjit.compile(f).lower(x).as_text() for f in fns]


CORPUS = _traced_corpus()
_graphs = _load_graphgen().graphs
IR_BITS = ["%", "%1", "%99", "=", ":", ",", "(", ")", "[", "]", "{", "}", "<", ">", "f32", "i8",
           "bool", "add", "dot_general", "func", "return", "loc(", '"', "\\", "\n", " ",
           "dense<", "base64", "1e309", "-0", "0x", "nan", "\u00e9", "\x00", "#"]

_GRAPH_TEXTS: list[str] = []


def _seed_texts() -> list[str]:
    """The traced corpus plus 30 random well-typed graphs (tests/ir/ir_graphgen.py), drawn once:
    generating a graph per example would cost more than the fuzzing itself."""
    if not _GRAPH_TEXTS:
        @settings(max_examples=30, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(_graphs(max_nodes=6))
        def collect(g):
            _GRAPH_TEXTS.append(print_graph(g))
        collect()
    return CORPUS + _GRAPH_TEXTS


@st.composite
def _mutated(draw) -> str:
    text = draw(st.sampled_from(_seed_texts()))
    for _ in range(draw(st.integers(1, 4))):
        n = len(text)
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 12)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "truncate", "dupline",
                                     "swaplines"]))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(IR_BITS) | st.text(max_size=3)) + text[i:]
        elif kind == "replace":
            text = text[:i] + draw(st.sampled_from(IR_BITS)) + text[j:]
        elif kind == "truncate":
            text = text[:i]
        else:
            lines = text.split("\n")
            a = draw(st.integers(0, len(lines) - 1))
            b = draw(st.integers(0, len(lines) - 1))
            if kind == "dupline":
                lines.insert(b, lines[a])
            else:
                lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
    return text


_LINE_COL = re.compile(r"^line (\d+), column (\d+): ")


def _parse_cleanly(text: str) -> None:
    try:
        parse(text)
    except IRSyntaxError as e:
        m = _LINE_COL.match(str(e))
        assert m, f"no line/column in: {e}"
        line, col = int(m[1]), int(m[2])
        assert 1 <= line <= text.count("\n") + 2 and col >= 1, (line, col, str(e))


def test_corpus_parses():
    for text in CORPUS:
        assert print_graph(parse(text)) == text


@pytest.fixture(scope="module")
def seed_texts():
    return _seed_texts()  # drawn here, outside the fuzzing @given


@FUZZ
@given(text=_mutated())
def test_parser_mutated_programs(seed_texts, text):
    _parse_cleanly(text)


@FUZZ
@given(st.text(max_size=200) | st.lists(st.sampled_from(IR_BITS), max_size=40).map("".join))
def test_parser_random_text(text):
    _parse_cleanly(text)


# ---- the safetensors weight loader -----------------------------------------------------------

EXPECTED = {"enc.w": (3, 4), "enc.b": (4,)}
_GOOD = {"enc.w": np.arange(12, dtype=np.float32).reshape(3, 4),
         "enc.b": np.linspace(-1, 1, 4).astype(np.float16)}


@pytest.fixture(scope="module")
def wdir():
    d = tempfile.mkdtemp(prefix="rj_fuzz_weights_")
    save_file(_GOOD, os.path.join(d, "good.safetensors"))
    yield d
    shutil.rmtree(d)


def _split(blob: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _join(header, data: bytes) -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


_dtype_tags = st.sampled_from(["F32", "F16", "BF16", "F64", "I8", "U8", "I32", "I64", "BOOL",
                               "F8_E4M3", "f32", "", "X"])
_json_junk = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=5),
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                          max_leaves=6)


@st.composite
def _damaged(draw, good: bytes) -> bytes:
    header, data = _split(good)
    kind = draw(st.sampled_from(["truncate", "flip", "dtype", "shape", "offsets", "junk_entry",
                                 "header_len", "not_json", "drop_key"]))
    key = draw(st.sampled_from(sorted(EXPECTED)))
    if kind == "truncate":
        return good[:draw(st.integers(0, len(good) - 1))]
    if kind == "flip":
        b = bytearray(good)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(b) - 1))
            b[i] = draw(st.integers(0, 255))
        return bytes(b)
    if kind == "dtype":
        header[key]["dtype"] = draw(_dtype_tags)
    elif kind == "shape":
        header[key]["shape"] = draw(st.lists(st.integers(-3, 2**40), max_size=4))
    elif kind == "offsets":
        header[key]["data_offsets"] = draw(st.lists(st.integers(-5, 2**66), max_size=3))
    elif kind == "junk_entry":
        header[key] = draw(_json_junk)
    elif kind == "drop_key":
        del header[key]
    elif kind == "header_len":
        return struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + good[8:]
    else:
        return _join(draw(st.binary(max_size=40)), data)
    return _join(header, data)


def test_weights_fuzz(wdir):
    good = Path(wdir, "good.safetensors").read_bytes()
    path = os.path.join(wdir, "bad.safetensors")
    loaded = load_safetensors(os.path.join(wdir, "good.safetensors"), EXPECTED)
    for k, v in _GOOD.items():
        np.testing.assert_array_equal(loaded[k], v.astype(np.float32))

    @FUZZ
    @given(_damaged(good))
    def one(blob):
        with open(path, "wb") as f:
            f.write(blob)
        try:
            out = load_safetensors(path, EXPECTED)
        except WeightError as e:
            assert path in str(e), str(e)
            return
        # a byte flip inside tensor data is undetectable (safetensors has no checksum); what
        # loads must still have the promised names, shapes and a float dtype
        assert set(out) == set(EXPECTED)
        for k, shape in EXPECTED.items():
            assert out[k].shape == shape and out[k].dtype == np.float32

    one()


# ---- the simulator's regcmd decoder ----------------------------------------------------------

def _registers() -> list[tuple[int, int]]:
    """(op byte of a write to the register's block, register offset) of every register."""
    from rockjit.lowering import registers as R
    return sorted({(r.target | R.OP_WRITE, r.offset) for r in R._index()[0].values()})


def _task_words(regs: list[tuple[int, int]], iovas: list[int]):
    """Task words as integers drawn in bulk (cheap for hypothesis): register writes of random,
    small and address-like values, raw random words, PC_OPERATION_ENABLE words with random
    block masks, and usually a trailer that fires the task."""
    from rockjit.lowering import registers as R

    enable = R.register("PC_OPERATION_ENABLE").offset
    item = st.tuples(st.integers(0, 5), st.integers(0, len(regs) - 1),
                     st.integers(0, 2**32 - 1) | st.integers(0, 64),
                     st.integers(0, len(iovas) - 1), st.integers(0, 2**64 - 1))

    def build(items_and_trailer) -> list[int]:
        items, trailer = items_and_trailer
        words = []
        for kind, ri, value, ai, raw in items:
            op, off = regs[ri]
            if kind == 0:
                words.append(raw)
            elif kind == 1:
                words.append(R.word(R.OP_ENABLE, value & 0x7F, enable))
            elif kind == 2:
                words.append(R.word(op, (iovas[ai] + (value & 0xFFFF)) & 0xFFFFFFFF, off))
            else:
                words.append(R.word(op, value, off))
        if trailer is not None:
            words.append(R.word(R.OP_ENABLE, trailer, enable))
        return words

    return st.tuples(st.lists(item, min_size=1, max_size=48),
                     st.none() | st.integers(0, 0x7F)).map(build)


@pytest.mark.slow  # ~18 s for 500 examples on the 2-core machine
def test_regcmd_decoder_fuzz():
    from rockjit.runtime import ProgramBuilder, RuntimeCError, SimDevice
    from rockjit.runtime.errors import ERROR_CLASSES

    regs = _registers()
    dev = SimDevice()
    # the BOs' device addresses are the same for every program on a fresh arena of this layout
    probe = ProgramBuilder(dev)
    sizes = (8192, 1 << 16, 1 << 16)
    iovas = [probe.bo_info(probe.add_bo(s, role)).iova for s, role in
             zip(sizes, ("regcmd", "io", "io"))]
    del probe
    seen: dict[str, int] = {}

    @FUZZ
    @given(_task_words(regs, iovas))
    def one(words):
        b = ProgramBuilder(dev)
        rc, src, dst = (b.add_bo(s, role) for s, role in zip(sizes, ("regcmd", "io", "io")))
        b.write_words(rc, words)
        try:
            job = b.add_job([(rc, 0, len(words))], reads=[src], writes=[dst])
            b.add_npu_step([job])
            prog = b.build(timeout_s=5.0)
            prog.run()
            seen["ran"] = seen.get("ran", 0) + 1
            prog.close()
        except RuntimeCError as e:
            assert type(e) in ERROR_CLASSES.values() and e.code in ERROR_CLASSES, repr(e)
            assert len(e.message) > 10, repr(e)
            seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1

    one()
    dev.close()
    # the fuzz reached the decoder's refusals, not only the loader's
    print("regcmd fuzz outcomes:", seen)
    assert len(seen) >= 2, seen


@pytest.mark.skipif(os.environ.get("RJ_UNDER_ASAN") == "1", reason="this is the ASan run itself")
@pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None,
                    reason="needs make and a C compiler")
@pytest.mark.slow
def test_regcmd_fuzz_under_asan():
    res = subprocess.run(["make", "-C", str(REPO / "csrc"), "asan-fuzz"], capture_output=True,
                         text=True, timeout=900)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out
    assert "regcmd fuzz passed under ASan+UBSan" in out
