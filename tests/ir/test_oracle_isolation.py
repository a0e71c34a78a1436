"""The error oracle (rockjit/oracle) stays out of the compiler: no module outside it imports
it, so a bound can never bend to agree with the code it checks (tests may import it). The
scan walks every import statement, including those inside functions."""
from __future__ import annotations

import ast
from pathlib import Path

import rockjit

PKG = Path(rockjit.__file__).parent


def _imports(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved)."""
    mod = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    pkg = mod.rsplit(".", 1)[0] if path.name != "__init__.py" else mod
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def test_no_compiler_module_imports_the_oracle() -> None:
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                 if "oracle" not in p.relative_to(PKG).parts
                 and any(m == "rockjit.oracle" or m.startswith("rockjit.oracle.")
                         for m in _imports(p))]
    assert not offenders, f"compiler modules import the error oracle: {offenders}"


def test_the_checker_sees_an_import() -> None:
    """The scan can fail: the oracle's own module imports the compiler."""
    assert "rockjit.ir.activations.activation" in _imports(PKG / "oracle" / "tolerance.py")
