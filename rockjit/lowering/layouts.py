"""Pack and unpack between row-major arrays and the NPU's cube layouts (numpy).

The NPU has no on-chip layout conversion, so the host scatters every operand into the layout
the CNA reads and gathers the DPU's output back (notes: matmul-as-conv.md, "The host must
pre-scatter the layouts"). Three families, all parameterised by the chip profile:

* Feature / output cube (notes: encodings/tile-layouts.md). A tensor of H rows x W columns x C
  channels is cut into ceil(C/C2) channel groups ("surfaces"); inside a surface the H*W positions
  follow row-major, each position an atom of C2 contiguous channels (C2 * esize = 16 bytes):
      byte(h, w, c) = (c // C2) * surf_stride + h * line_stride + w * C2 * esize + (c % C2) * esize
  with line_stride = W * 16 and surf_stride = H * line_stride unless a program asks for more.
  A matmul operand A[M, K] is the cube H=M, W=1, C=K; its result C[M, N] is H=M, W=1, C=N with
  the output C2 (16 / output element size). Channels past C inside the last group are zero.
  Integer outputs: the int32 cube of an int8 matmul is this same C2=4 layout; the size_e=7
  "integer stride" quirk (notes: encodings/size-e-quirk.md) lives in the DPU registers
  (SIZE_E=7, SURFACE_ADD x8) only -- conformance case 03 reads its int32 result as a plain
  [N/4][M][4] cube.

* Direct-conv / matmul weights (conformance 01 and 04, tile-layouts.md): kernels in groups of
  NG, channels in groups of KG, the kernel taps between them and a NG x KG block innermost:
      [N/NG][K/KG][KH][KW][NG][KG]    (fp16 NG=16 KG=32; int8 NG=32 KG=32)
  N and K are zero-padded up to whole groups.

* Depthwise weights (conformance 09, depthwise-conv.md): [C/G][KH][KW][G] (fp16 G=32).

Every packer returns little-endian bytes (np.uint8) and zero-fills padding; every unpacker
drops it. csrc/layout/rj_layout.c is the byte-identical C twin used by the runtime.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import RockjitError
from ..ir.types import DType
from .arith import ceil_div, round_up
from .profile import ChipProfile


class LayoutError(RockjitError, ValueError):
    """An array does not match the layout it is packed into or unpacked from."""


def _np(dtype: DType | np.dtype | str) -> np.dtype:
    if isinstance(dtype, DType):
        return dtype.to_numpy()
    return np.dtype(dtype)


def _as_bytes(raw: bytes | bytearray | memoryview | np.ndarray, need: int, what: str) -> np.ndarray:
    buf = np.frombuffer(raw, np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
    if buf.size < need:
        raise LayoutError(f"{what}: the buffer holds {buf.size} bytes but the layout spans {need}; "
                          f"pass the whole packed region")
    return buf


# ---------------------------------------------------------------------------------------------
# feature / output cubes
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CubeLayout:
    """A feature or output cube: H x W positions x C channels in groups of C2."""

    height: int
    width: int
    channels: int
    c2: int
    dtype: np.dtype
    line_stride: int = 0   # bytes between rows; 0 = dense (W * C2 * esize)
    surf_stride: int = 0   # bytes between channel groups; 0 = dense (H * line_stride)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _np(self.dtype))
        for name in ("height", "width", "channels", "c2"):
            if int(getattr(self, name)) < 1:
                raise LayoutError(f"cube {name} must be >= 1, got {getattr(self, name)}")
        atom = self.c2 * self.esize
        if self.line_stride == 0:
            object.__setattr__(self, "line_stride", self.width * atom)
        if self.surf_stride == 0:
            object.__setattr__(self, "surf_stride", self.height * self.line_stride)
        if self.line_stride < self.width * atom or self.line_stride % atom:
            raise LayoutError(f"line stride {self.line_stride} B must be a multiple of the "
                              f"{atom}-byte atom and hold {self.width} positions")
        if self.surf_stride < self.height * self.line_stride or self.surf_stride % atom:
            raise LayoutError(f"surface stride {self.surf_stride} B must be a multiple of the "
                              f"{atom}-byte atom and hold {self.height} lines of "
                              f"{self.line_stride} B")

    @property
    def esize(self) -> int:
        return self.dtype.itemsize

    @property
    def groups(self) -> int:
        return ceil_div(self.channels, self.c2)

    @property
    def padded_channels(self) -> int:
        return self.groups * self.c2

    @property
    def nbytes(self) -> int:
        """Bytes from the cube start to the end of its last atom."""
        return (self.groups - 1) * self.surf_stride + self.height * self.line_stride

    def _view(self, buf: np.ndarray) -> np.ndarray:
        """A strided [groups][H][W * C2 * esize] byte view of ``buf`` over the cube's atoms."""
        row = self.width * self.c2 * self.esize
        return np.lib.stride_tricks.as_strided(
            buf, shape=(self.groups, self.height, row), strides=(self.surf_stride, self.line_stride, 1))

    def pack(self, x: np.ndarray) -> np.ndarray:
        """[H, W, C] row-major -> cube bytes (padding channels and gaps zero)."""
        x = np.asarray(x)
        want = (self.height, self.width, self.channels)
        if x.shape != want:
            raise LayoutError(f"cube pack: expected an array of shape {want} (H, W, C), got {x.shape}")
        if x.dtype != self.dtype:
            raise LayoutError(f"cube pack: expected {self.dtype} elements, got {x.dtype}; "
                              f"cast before packing so rounding is explicit")
        h, w, c2 = self.height, self.width, self.c2
        out = np.zeros(self.nbytes, np.uint8)
        # the atoms as [G][H][W][C2] elements over ``out``; x's channels go straight in, in one
        # pass (no padded or transposed intermediate: a compile packs every bias cube so)
        cube = self._view(out).view(self.dtype.newbyteorder("<")).reshape(self.groups, h, w, c2)
        whole = self.channels // c2
        cube[:whole] = x[..., :whole * c2].reshape(h, w, whole, c2).transpose(2, 0, 1, 3)
        if whole < self.groups:
            cube[whole, :, :, :self.channels - whole * c2] = x[..., whole * c2:]
        return out

    def unpack(self, raw: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
        """cube bytes -> [H, W, C] row-major."""
        buf = _as_bytes(raw, self.nbytes, "cube unpack")
        rows = np.ascontiguousarray(self._view(buf))
        vals = rows.view(self.dtype.newbyteorder("<")).astype(self.dtype)
        cube = vals.reshape(self.groups, self.height, self.width, self.c2).transpose(1, 2, 0, 3)
        full = cube.reshape(self.height, self.width, self.padded_channels)
        return np.ascontiguousarray(full[..., :self.channels])


def feature_layout(profile: ChipProfile, dtype: DType, height: int, width: int, channels: int,
                   line_stride: int = 0, surf_stride: int = 0) -> CubeLayout:
    """The CNA input feature cube for ``dtype`` (C2 from the profile)."""
    p = profile.input(dtype)
    return CubeLayout(height, width, channels, p.feature_c2, dtype.to_numpy(),
                      line_stride, surf_stride)


def output_layout(profile: ChipProfile, in_dtype: DType, out_dtype: DType, height: int,
                  width: int, channels: int, line_stride: int = 0,
                  surf_stride: int = 0) -> CubeLayout:
    """The DPU output cube a ``in_dtype`` conv writes as ``out_dtype``."""
    o = profile.output(in_dtype, out_dtype)
    return CubeLayout(height, width, channels, o.c2, out_dtype.to_numpy(), line_stride, surf_stride)


def matrix_feature_layout(profile: ChipProfile, dtype: DType, rows: int, cols: int) -> CubeLayout:
    """A[rows, cols] as the 1-wide feature cube [cols/C2][rows][C2] (notes: matmul-as-conv.md)."""
    return feature_layout(profile, dtype, rows, 1, cols)


def matrix_output_layout(profile: ChipProfile, in_dtype: DType, out_dtype: DType, rows: int,
                         cols: int) -> CubeLayout:
    return output_layout(profile, in_dtype, out_dtype, rows, 1, cols)


def pack_matrix(layout: CubeLayout, a: np.ndarray) -> np.ndarray:
    """[rows, cols] -> bytes of a 1-wide cube."""
    a = np.asarray(a)
    if a.ndim != 2:
        raise LayoutError(f"pack_matrix expects a 2-D array, got shape {a.shape}")
    return layout.pack(a.reshape(a.shape[0], 1, a.shape[1]))


def unpack_matrix(layout: CubeLayout, raw: bytes | np.ndarray) -> np.ndarray:
    return layout.unpack(raw).reshape(layout.height, layout.channels)


# ---------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WeightLayout:
    """Direct-conv / matmul weights [N][K][KH][KW] as [N/NG][K/KG][KH][KW][NG][KG]."""

    kernels: int
    channels: int
    kh: int
    kw: int
    n_group: int
    k_group: int
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _np(self.dtype))
        for name in ("kernels", "channels", "kh", "kw", "n_group", "k_group"):
            if int(getattr(self, name)) < 1:
                raise LayoutError(f"weight {name} must be >= 1, got {getattr(self, name)}")

    @property
    def padded_kernels(self) -> int:
        return round_up(self.kernels, self.n_group)

    @property
    def padded_channels(self) -> int:
        return round_up(self.channels, self.k_group)

    @property
    def nbytes(self) -> int:
        return self.padded_kernels * self.padded_channels * self.kh * self.kw * self.dtype.itemsize

    def _blocks(self) -> tuple[int, int, int, int, int, int]:
        return (self.padded_kernels // self.n_group, self.n_group,
                self.padded_channels // self.k_group, self.k_group, self.kh, self.kw)

    def pack(self, w: np.ndarray) -> np.ndarray:
        w = np.asarray(w)
        if w.ndim == 2 and self.kh == self.kw == 1:
            w = w.reshape(w.shape[0], w.shape[1], 1, 1)
        want = (self.kernels, self.channels, self.kh, self.kw)
        if w.shape != want:
            raise LayoutError(f"weight pack: expected shape {want} (N, K, KH, KW) or (N, K) for "
                              f"a 1x1 kernel, got {w.shape}")
        if w.dtype != self.dtype:
            raise LayoutError(f"weight pack: expected {self.dtype} elements, got {w.dtype}")
        out = np.empty(self.nbytes, np.uint8)
        self.pack_into(w, out)
        return out

    def pack_into(self, w: np.ndarray, out: np.ndarray) -> None:
        """Write the packed bytes of ``w`` [n, k, KH, KW] (any strides; n <= kernels and
        k <= channels, the rest zero as padding is) into ``out`` (np.uint8[nbytes]), in one
        strided copy per rectangle of whole or ragged groups: no padded or transposed copy
        of the weight is made first (a compile packs every projection weight)."""
        if w.ndim == 2 and self.kh == self.kw == 1:
            w = w[:, :, None, None]
        if w.dtype != self.dtype:
            raise LayoutError(f"weight pack: expected {self.dtype} elements, got {w.dtype}")
        n, k = w.shape[0], w.shape[1]
        if w.ndim != 4 or w.shape[2:] != (self.kh, self.kw) or n > self.kernels or k > self.channels:
            raise LayoutError(f"weight pack: {w.shape} does not fit ({self.kernels}, "
                              f"{self.channels}, {self.kh}, {self.kw})")
        if out.dtype != np.uint8 or out.shape != (self.nbytes,):
            raise LayoutError(f"weight pack: the destination must be np.uint8[{self.nbytes}]")
        nb, ng, kb, kg, kh, kw = self._blocks()
        # [nb][kb][kh][kw][ng][kg] seen as [nb][ng][kb][kg][kh][kw]
        dst = out.view(self.dtype.newbyteorder("<")).reshape(nb, kb, kh, kw, ng, kg)
        dst = dst.transpose(0, 4, 1, 5, 2, 3)
        if n < nb * ng or k < kb * kg:         # padding or a short source: zeros first
            out[:] = 0
        for n0, n1 in _group_runs(n, ng):
            for k0, k1 in _group_runs(k, kg):
                part = w[n0:n1, k0:k1]
                bn, bk = max(1, (n1 - n0) // ng), max(1, (k1 - k0) // kg)
                dst[n0 // ng:n0 // ng + bn, :(n1 - n0) // bn, k0 // kg:k0 // kg + bk,
                    :(k1 - k0) // bk] = part.reshape(bn, (n1 - n0) // bn, bk, (k1 - k0) // bk,
                                                     kh, kw)

    def unpack(self, raw: bytes | np.ndarray) -> np.ndarray:
        """-> [N, K, KH, KW] (padding dropped)."""
        buf = _as_bytes(raw, self.nbytes, "weight unpack")
        nb, ng, kb, kg, kh, kw = self._blocks()
        t = buf[:self.nbytes].view(self.dtype.newbyteorder("<")).astype(self.dtype)
        w = t.reshape(nb, kb, kh, kw, ng, kg).transpose(0, 4, 1, 5, 2, 3)
        w = w.reshape(self.padded_kernels, self.padded_channels, kh, kw)
        return np.ascontiguousarray(w[:self.kernels, :self.channels])


def _group_runs(n: int, group: int) -> list[tuple[int, int]]:
    """[0, n) as the run of whole groups and the ragged tail (each present when not empty)."""
    full = n // group * group
    return [r for r in ((0, full), (full, n)) if r[1] > r[0]]


def weight_layout(profile: ChipProfile, dtype: DType, kernels: int, channels: int,
                  kh: int = 1, kw: int = 1) -> WeightLayout:
    p = profile.input(dtype)
    return WeightLayout(kernels, channels, kh, kw, p.weight_n_group, p.weight_k_group,
                        dtype.to_numpy())


@dataclass(frozen=True)
class DepthwiseWeightLayout:
    """Depthwise weights [C][KH][KW] as [C/G][KH][KW][G] (zero-padded to whole groups)."""

    channels: int
    kh: int
    kw: int
    group: int
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _np(self.dtype))
        for name in ("channels", "kh", "kw", "group"):
            if int(getattr(self, name)) < 1:
                raise LayoutError(f"depthwise weight {name} must be >= 1, got {getattr(self, name)}")

    @property
    def padded_channels(self) -> int:
        return ceil_div(self.channels, self.group) * self.group

    @property
    def nbytes(self) -> int:
        return self.padded_channels * self.kh * self.kw * self.dtype.itemsize

    def pack(self, w: np.ndarray) -> np.ndarray:
        w = np.asarray(w)
        want = (self.channels, self.kh, self.kw)
        if w.shape != want:
            raise LayoutError(f"depthwise weight pack: expected shape {want} (C, KH, KW), got {w.shape}")
        if w.dtype != self.dtype:
            raise LayoutError(f"depthwise weight pack: expected {self.dtype} elements, got {w.dtype}")
        wp = np.zeros((self.padded_channels, self.kh, self.kw), self.dtype)
        wp[:self.channels] = w
        g = self.padded_channels // self.group
        t = wp.reshape(g, self.group, self.kh, self.kw).transpose(0, 2, 3, 1)
        return np.ascontiguousarray(t).astype(self.dtype.newbyteorder("<")).view(np.uint8).reshape(-1)

    def unpack(self, raw: bytes | np.ndarray) -> np.ndarray:
        buf = _as_bytes(raw, self.nbytes, "depthwise weight unpack")
        g = self.padded_channels // self.group
        t = buf[:self.nbytes].view(self.dtype.newbyteorder("<")).astype(self.dtype)
        w = t.reshape(g, self.kh, self.kw, self.group).transpose(0, 3, 1, 2)
        return np.ascontiguousarray(w.reshape(self.padded_channels, self.kh, self.kw)[:self.channels])


def depthwise_weight_layout(profile: ChipProfile, dtype: DType, channels: int, kh: int,
                            kw: int) -> DepthwiseWeightLayout:
    return DepthwiseWeightLayout(channels, kh, kw, profile.input(dtype).dw_group, dtype.to_numpy())
