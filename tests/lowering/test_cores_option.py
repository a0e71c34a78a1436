"""``rockjit.compile(..., cores=N)``: the program laid out for N of the chip's NPU cores.

Each core is a device context with its own BOs (rocket: one fd and its own IOVA space), so a
program for fewer cores spreads no step's jobs past them, copies nothing to the cores it does
not use and holds its weights only there. Checked on the simulator against JAX on the CPU (the
fp16 bound of rockjit.oracle.tolerance), and the counts against what the layout must give: one
core moves no byte between cores and uploads each weight once (the packed weight bytes are
computed here from the weight shapes and the layout facts, not read from the compiler).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.oracle import tolerance as T

K_GROUP, N_GROUP, F16 = 32, 16, 2     # fp16 weight atoms (notes: matmul-as-conv.md, alignment)


def _heads(p, x):
    q = (x @ p["wq"]).reshape(48, 6, 32).transpose(1, 0, 2)
    k = (x @ p["wk"]).reshape(48, 6, 32).transpose(1, 0, 2)
    return jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, k), axis=-1)


def _rows(w, x):
    # many rows, few columns: by default its jobs are row blocks, each core reading all of w
    return jnp.tanh(x @ w)


def _heads_case():
    rng = np.random.default_rng(11)
    p = {n: (rng.standard_normal((192, 192)) / 14).astype(np.float32) for n in ("wq", "wk")}
    return _heads, p, rng.standard_normal((48, 192)).astype(np.float32)


def _run(fn, p, x, cores):
    f = rockjit.compile(fn, resident_argnums=0, backend="sim", cores=cores)
    y = np.asarray(f(p, x))
    c = f.compiled(p, x)
    return y, c.stats(), c._runner.image, c


@pytest.mark.parametrize("cores", [1, 2])
def test_the_program_uses_only_the_cores_asked_for(cores) -> None:
    fn, p, x = _heads_case()
    y, st, img, c = _run(fn, p, x, cores)
    y_all, st_all, img_all, _ = _run(fn, p, x, None)
    ref = np.asarray(jax.jit(fn)(p, x), np.float64)      # JAX on the CPU
    T.check(y, ref, T.graph_bound(c.graph, c.params, [x])[0] + 2.0 ** -23 * np.abs(ref),
            f"attention heads on {cores} core(s)")
    # the same tasks on other cores: the same bits as the default layout
    assert np.array_equal(y, y_all)
    assert img_all.contexts == 3 and st_all["cores_used"] == 3
    assert img.contexts == cores and st["cores_used"] == cores
    assert {b.core for b in img.bos} == set(range(cores))
    assert all(st[f"jobs_core{k}"] > 0 for k in range(cores))
    assert st["tasks"] == st_all["tasks"]
    if cores == 1:
        assert st["host_copy_steps"] == 0 and st["host_bytes_copied"] == 0
    else:
        assert st["host_bytes_copied"] > 0


def test_one_core_uploads_each_weight_once() -> None:
    rng = np.random.default_rng(12)
    m, k, n = 1024, 256, 256
    w = (rng.standard_normal((k, n)) / 16).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    packed = -(-n // N_GROUP) * N_GROUP * -(-k // K_GROUP) * K_GROUP * F16
    y1, _, img1, c = _run(_rows, w, x, 1)
    y3, _, img3, _ = _run(_rows, w, x, None)

    def weight_bytes(img):
        return sum(b.size for b in img.bos if b.role == "weights")
    assert weight_bytes(img1) == packed
    # the default layout's row blocks each read all of w on their own core
    assert weight_bytes(img3) >= 2 * packed
    ref = np.tanh(x.astype(np.float64) @ w.astype(np.float64))
    T.check(y1, ref, T.graph_bound(c.graph, c.params, [x])[0] + 2.0 ** -23 * np.abs(ref),
            "x @ w on one core")
    assert np.array_equal(y1, y3)


@pytest.mark.parametrize("cores, error, says", [
    (0, ValueError, "use 1 to 3"), (4, ValueError, "has 3 cores"), (-1, ValueError, "use 1 to 3"),
    (1.5, TypeError, "must be an int"), (True, TypeError, "must be an int"),
    ("2", TypeError, "must be an int")])
def test_a_core_count_the_chip_does_not_have_is_refused(cores, error, says) -> None:
    with pytest.raises(error, match=says):
        rockjit.compile(_rows, backend="sim", cores=cores)


def test_cores_on_the_interpreter_is_refused() -> None:
    with pytest.raises(ValueError, match="no NPU cores"):
        rockjit.compile(_rows, backend="interpreter", cores=1)


def test_a_bundle_keeps_the_core_count(tmp_path) -> None:
    fn, p, x = _heads_case()
    compiled = rockjit.export(fn, p, x, resident_argnums=0, backend="sim", cores=1)
    manifest = compiled.save(str(tmp_path / "heads.rjb"))
    assert manifest["contexts"] == 1
    y, *_ = _run(fn, p, x, None)
    with rockjit.load(tmp_path / "heads.rjb", backend="sim") as bundle:
        assert bundle.image.contexts == 1
        assert np.array_equal(np.asarray(bundle(x)), y)
