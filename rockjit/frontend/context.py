"""Walking a jaxpr into the rockjit IR: the importer and the per-equation context rules see."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from jax.extend import core as jcore

from ..errors import UnsupportedError, VerifyError
from ..ir.graph import Builder, Loc, Value, cached_attr
from ..ir.ops import Op
from ..ir.types import DType, TensorType
from .locations import user_loc
from .registry import IMPORT_RULES, supported_primitives


class FrontendBugError(RuntimeError):
    """An import rule produced IR that disagrees with the jaxpr's own types.  Not user error."""


def _where(loc: Loc | None) -> str:
    return f" at {loc}" if loc is not None else ""


def dtype_of(np_dtype: Any, loc: Loc | None, what: str) -> DType:
    """The IR element type of a jax/numpy dtype, or an UnsupportedError naming ``what``."""
    try:
        return DType.from_numpy(np.dtype(np_dtype))
    except TypeError:
        names = ", ".join(d.value for d in DType)
        dt = np.dtype(np_dtype)
        raise UnsupportedError(
            f"{what}{_where(loc)} has dtype {dt.name}, which the rockjit IR cannot hold (it has "
            f"{names}); {dtype_advice(dt, 'before this point')}") from None


def dtype_advice(dt: np.dtype, when: str) -> str:
    """What to do about a dtype the IR lacks. A complex value (jnp.fft, complex arithmetic) has
    no real cast that keeps its meaning, so .astype() is no advice for it."""
    if dt.kind == "c":
        return ("complex numbers (from jnp.fft or complex arithmetic) have no NPU or IR form and "
                "no cast keeps their meaning: compute this part outside the compiled function "
                "(e.g. under jax.jit) and pass its real and imaginary parts in as float32 arrays")
    return f"cast it with .astype() {when}"


# (dtype, shape) of an aval -> its TensorType. The importer asks per operand and result of
# every equation, and a model's layers ask about the same few types; a type is immutable and
# shared. Bounded, so a long-lived process does not grow it without end.
_TYPES: dict[tuple[Any, Any], TensorType] = {}
_TYPES_MAX = 1 << 12


def tensor_type(aval: Any, loc: Loc | None, what: str) -> TensorType:
    key = (aval.dtype, aval.shape)
    try:
        t = _TYPES.get(key)
    except TypeError:   # an unhashable shape (not from a traced jaxpr): answered anew
        t, key = None, None
    if t is None:
        t = TensorType(dtype_of(aval.dtype, loc, what), tuple(int(d) for d in aval.shape))
        if key is not None:
            if len(_TYPES) >= _TYPES_MAX:
                _TYPES.clear()
            _TYPES[key] = t
    return t


def _format_supported() -> str:
    names = supported_primitives()
    lines, line = [], "  "
    for n in names:
        if len(line) + len(n) + 2 > 96:
            lines.append(line.rstrip())
            line = "  "
        line += n + ", "
    lines.append(line.rstrip(", "))
    return "\n".join(lines)


def unsupported_primitive(name: str, loc: Loc | None) -> UnsupportedError:
    return UnsupportedError(
        f"rockjit cannot compile the JAX primitive '{name}'{_where(loc)}.\n"
        f"Rewrite that expression with supported operations or compute it outside the "
        f"compiled function. Supported primitives:\n{_format_supported()}")


class Importer:
    """Appends the IR of one or more (nested) jaxprs to a Builder."""

    def __init__(self, builder: Builder, default_loc: Loc | None = None) -> None:
        self.builder = builder
        self.default_loc = default_loc
        # One constant node per distinct literal; canonicalize would merge them anyway, but the
        # unfolded graph stays readable when it is dumped.
        self._literals: dict[tuple[str, tuple[int, ...], bytes], Value] = {}
        # traceback -> its user frame's loc. A model's layers are one Python loop, so every
        # layer's equations carry equal tracebacks (equal frames); jax's own memo of
        # user_frame keeps the last 64, fewer than one layer has.
        self._locs: dict[Any, Loc | None] = {}

    # -------------------------------------------------------------- node helpers
    def constant(self, value: Any, loc: Loc | None,
                 what: str | Callable[[], str] = "a constant") -> Value:
        """``what`` names the value in the error for an unsupported dtype; a callable is only
        called then (a literal's repr runs numpy's array printer: too slow for every literal)."""
        arr = np.asarray(value)
        try:
            DType.from_numpy(arr.dtype)
        except TypeError:   # fail with a user-facing message, not a TypeError
            dtype_of(arr.dtype, loc, what() if callable(what) else what)
        arr = np.array(arr, copy=True)
        arr.setflags(write=False)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        hit = self._literals.get(key)
        if hit is not None:
            return hit
        v = self.builder.add(Op.CONSTANT, [], None, {"value": arr}, loc)
        self._literals[key] = v
        return v

    def _user_loc(self, source_info: Any) -> Loc | None:
        tb = getattr(source_info, "traceback", None)
        try:
            return self._locs[tb]
        except KeyError:
            loc = self._locs[tb] = user_loc(source_info)
            return loc
        except TypeError:   # an unhashable traceback: not remembered
            return user_loc(source_info)

    # -------------------------------------------------------------- walking
    def import_jaxpr(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Value],
                     loc: Loc | None) -> list[Value]:
        """Import an open jaxpr applied to ``args``; ``consts`` bind its constvars.

        ``loc`` is the location of the call that reached this jaxpr: equations without a user
        frame of their own (those inside jax's own helpers) inherit it."""
        if len(consts) != len(jaxpr.constvars) or len(args) != len(jaxpr.invars):
            raise FrontendBugError(
                f"jaxpr takes {len(jaxpr.constvars)} consts and {len(jaxpr.invars)} args, "
                f"got {len(consts)} and {len(args)}{_where(loc)}")
        env: dict[Any, Value] = {}
        for var, c in zip(jaxpr.constvars, consts):
            env[var] = self.constant(c, loc, f"a constant captured by the function ({var.aval})")
        for var, v in zip(jaxpr.invars, args):
            want = tensor_type(var.aval, loc, "an argument")
            if v.type != want:
                raise FrontendBugError(f"jaxpr argument {var} is {want}, bound to {v.type}")
            env[var] = v

        def read(atom: Any, at: Loc | None) -> Value:
            if isinstance(atom, jcore.Literal):
                return self.constant(np.asarray(atom.val, dtype=atom.aval.dtype), at,
                                     lambda: f"the literal {atom.val!r}")
            return env[atom]

        for eqn in jaxpr.eqns:
            if all(isinstance(o, jcore.DropVar) for o in eqn.outvars):
                # Every primitive we import is pure: an equation whose results are all dropped
                # (jax.nn.logsumexp's `_ = sign ...`) cannot change the outputs.
                continue
            eqn_loc = self._user_loc(eqn.source_info) or loc
            name = eqn.primitive.name
            rule = IMPORT_RULES.get(name)
            if rule is None:
                raise unsupported_primitive(name, eqn_loc)
            ins = [read(a, eqn_loc) for a in eqn.invars]
            ctx = EqnContext(self, eqn, eqn_loc)
            try:
                outs = rule(ctx, *ins)
            except VerifyError as e:
                # The rule mapped a legal jaxpr equation onto IR the op rules reject: a form of
                # the primitive (dtype, operand mix) the IR has no meaning for.
                raise UnsupportedError(
                    f"rockjit cannot compile this use of the JAX primitive '{name}'"
                    f"{_where(eqn_loc)}: the IR rejects it: {e}") from None
            outs = [outs] if isinstance(outs, Value) else list(outs)
            if len(outs) != len(eqn.outvars):
                raise FrontendBugError(f"import rule for {name} returned {len(outs)} values, the "
                                       f"equation has {len(eqn.outvars)}{_where(eqn_loc)}")
            for var, v in zip(eqn.outvars, outs):
                if isinstance(var, jcore.DropVar):
                    continue
                want = tensor_type(var.aval, eqn_loc, f"the result of {name}")
                if v.type != want:
                    raise FrontendBugError(f"import rule for {name} produced {v.type}, the jaxpr "
                                           f"says {want}{_where(eqn_loc)}")
                env[var] = v
        return [read(a, loc) for a in jaxpr.outvars]

    def inline(self, closed_or_open: Any, args: Sequence[Value], loc: Loc | None) -> list[Value]:
        """Import a ClosedJaxpr or an open Jaxpr (no consts) in place of a call equation."""
        if hasattr(closed_or_open, "jaxpr") and hasattr(closed_or_open, "consts"):
            return self.import_jaxpr(closed_or_open.jaxpr, closed_or_open.consts, args, loc)
        return self.import_jaxpr(closed_or_open, (), args, loc)


@dataclass
class EqnContext:
    """What an import rule sees: the equation, its location, and node builders at that loc."""

    importer: Importer
    eqn: Any
    loc: Loc | None

    @property
    def params(self) -> Mapping[str, Any]:
        return self.eqn.params

    @property
    def primitive(self) -> str:
        return self.eqn.primitive.name

    @cached_attr
    def out_types(self) -> list[TensorType]:
        # asked several times per equation (the rule, its broadcasts); the equation is fixed
        return [tensor_type(v.aval, self.loc, f"the result of {self.primitive}")
                for v in self.eqn.outvars]

    @property
    def out_type(self) -> TensorType:
        (t,) = self.out_types
        return t

    def unsupported(self, reason: str) -> UnsupportedError:
        """An error for a supported primitive used in a form rockjit cannot compile."""
        return UnsupportedError(f"rockjit cannot compile this use of the JAX primitive "
                                f"'{self.primitive}'{_where(self.loc)}: {reason}")

    # -------------------------------------------------------------- node builders
    def add(self, op: Op, inputs: Iterable[Value], attrs: Mapping[str, Any] | None = None,
            out_type: TensorType | None = None) -> Value:
        return self.importer.builder.add(op, inputs, out_type, attrs or {}, self.loc)

    def constant(self, value: Any) -> Value:
        return self.importer.constant(value, self.loc)

    def scalar(self, value: Any, dtype: DType) -> Value:
        return self.constant(np.asarray(value, dtype=dtype.to_numpy()))

    def full(self, value: Any, t: TensorType) -> Value:
        """A tensor of type ``t`` filled with ``value``: a scalar constant broadcast."""
        return self.broadcast_to(self.scalar(value, t.dtype), t.shape)

    def broadcast_to(self, v: Value, shape: Sequence[int]) -> Value:
        """``v`` broadcast to ``shape`` (rank-0 values, or equal-rank values with size-1 dims)."""
        shape = tuple(int(d) for d in shape)
        if v.type.shape == shape:
            return v
        if v.type.rank == 0:
            dims: tuple[int, ...] = ()
        elif v.type.rank == len(shape):
            dims = tuple(range(len(shape)))
        else:
            raise FrontendBugError(f"cannot broadcast {v.type} to {list(shape)}{_where(self.loc)}")
        return self.add(Op.BROADCAST_IN_DIM, [v], {"broadcast_dimensions": dims},
                        TensorType(v.type.dtype, shape))

    def convert(self, v: Value, dtype: DType) -> Value:
        if v.type.dtype is dtype:
            return v
        return self.add(Op.CONVERT, [v], {}, TensorType(dtype, v.type.shape))

    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(d) for d in shape)
        if v.type.shape == shape:
            return v
        return self.add(Op.RESHAPE, [v], {}, TensorType(v.type.dtype, shape))

    def transpose(self, v: Value, perm: Sequence[int]) -> Value:
        perm = tuple(int(p) for p in perm)
        if perm == tuple(range(len(perm))):
            return v
        return self.add(Op.TRANSPOSE, [v], {"permutation": perm})

    def inline(self, jaxpr: Any, args: Sequence[Value]) -> list[Value]:
        return self.importer.inline(jaxpr, args, self.loc)
