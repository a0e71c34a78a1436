"""A bundle loads and runs in a process where importing JAX fails: the runtime, the image and
the bundle reader need neither JAX nor the compiler."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from .bundle_testutil import save_block

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import importlib.abc, sys

    class NoJax(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("jax", "jaxlib"):
                raise ImportError(f"blocked import of {name} (this process must not use JAX)")
            return None

    sys.meta_path.insert(0, NoJax())
    import numpy as np
    import rockjit

    bundle, inputs, out = sys.argv[1:4]
    with rockjit.load(bundle, backend="sim") as b:
        y = b(np.load(inputs))
        print(b.step_list().splitlines()[0])
    np.savez(out, **y)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib"))
    assert not loaded, loaded
    try:
        import jax
    except ImportError as e:
        print("jax blocked:", e)
""")


def test_bundle_runs_without_jax(tmp_path) -> None:
    x, y = save_block(tmp_path / "b.rjb")
    np.save(tmp_path / "x.npy", x)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "b.rjb"),
                        str(tmp_path / "x.npy"), str(tmp_path / "y.npz")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "jax blocked" in r.stdout
    got = np.load(tmp_path / "y.npz")
    assert sorted(got.files) == sorted(y)
    for k in y:
        assert np.array_equal(got[k], y[k])
