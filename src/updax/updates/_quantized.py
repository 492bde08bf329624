r"""Quantized state: a pipeline's moments stored in 8 or 4 bits (or float8) between steps.

Adam's state is twice the params in float32. Stored block-wise in 8 bits
(Dettmers et al. 2022) it is a quarter of that, in 4 bits (Li et al. 2023) an
eighth. Which fields may be stored so is a declaration of the stage that owns
them (``MomentField``, ``SecondMomentField`` in its state NamedTuple); the
wrapper dequantizes them at the start of the jitted step and quantizes the new
values at its end, so XLA fuses both into the rule's kernel.

The maps, as the papers describe them (each value a fraction of its block's
absolute maximum, or of its rank-1 normalizer):

- dynamic (tree) map, ``bits`` bits: a sign bit (signed maps only), then
  ``E`` zero bits giving the decade :math:`10^{-E}`, an indicator bit set to
  one, and the remaining ``k`` bits a linear (bisection tree) code of the
  fraction in :math:`[0.1, 1]`: the centres of its :math:`2^k` equal bins.
  The pattern of no set bit is 0, and with the sign bit (it would repeat 0)
  it is 1, so that a block's largest positive value is stored exactly.
  Signed 8 bits: 254 values from :math:`\pm 5.5\cdot10^{-7}` to
  :math:`\pm 0.9965`, 0 and 1; unsigned: 256 values from 0 and
  :math:`5.5\cdot10^{-8}` to 0.9982.
- linear map without zero, 4 bits: :math:`(i + 1) / 16`, :math:`i = 0..15`
  (Li et al.: a second moment quantized to 0 makes :math:`1/\sqrt{\nu}`
  explode).
- float8: ``float8_e4m3fn`` of the value times :math:`448 / \text{absmax}`.

A value is stored as the nearest value of its map, its code that value's
rank among the map's sorted values: the number of the map's midpoints
(taken in float32, ``(a + b) / 2``) strictly below it, so a value on a
midpoint takes the smaller code. The code is computed directly, with no
search over the map: a linear map's from ``16 x``, a dynamic map's from the
decade of ``|x|`` and the bin of its fraction (:func:`_below`), then one
comparison with the float32 midpoint above (a lookup in a table of
``2**bits``, or for the linear map exact arithmetic) decides between the
two neighbours.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from updax import _rounding, _tree
from updax._combinators import combinator
from updax._domains import Integer, OneOf, Pipeline, Valid, fail, field_quantizable
from updax._primitives import stateful
from updax._stage import ScheduledState
from updax._update import Update
from updax.updates._kernels import real_only

__all__ = ["QuantizedArray", "QuantizedState", "dynamic_map", "linear_map", "quantized_state"]


class QuantizedState(NamedTuple):
    """The wrapped pipeline's state with each eligible leaf stored as a ``QuantizedArray`` (see
    :func:`quantized_state`), and with ``rounding="stochastic"`` the ``count`` of steps taken (uint32, wrapping
    at 2**32), which keys each step's random bits; None otherwise."""

    inner: tuple
    count: Any = None


class QuantizedArray(NamedTuple):
    """One state leaf in fewer bits: ``codes`` (uint8: one code per element in 8 bits, two per byte in 4 bits,
    along the last axis; ``float8_e4m3fn`` values for float8) and ``scales``: each block's absolute maximum
    (float32, blocks along the last axis), or for the rank-1 normalization a tuple of the maxima along each
    axis (float32)."""

    codes: jax.Array
    scales: Any


# --------------------------------------------------------------------------
# The maps, from the papers' descriptions (float64; the kernels use float32 copies)


def dynamic_map(bits: int, signed: bool) -> np.ndarray:
    """The dynamic (tree) quantization map of Dettmers et al.: the value of each code ``0 .. 2**bits - 1``
    (float64). A code is a sign bit (signed maps), then ``E`` zero bits for the decade ``10**-E``, an indicator
    bit, and ``k`` bits for the centre of one of ``2**k`` equal bins of the fraction's range [0.1, 1]; no bit
    set is 0, and the sign bit alone (which would repeat 0) is 1."""
    magnitude_bits = bits - 1 if signed else bits
    values = np.zeros(2**bits)
    for code in range(2**bits):
        pattern = code & (2**magnitude_bits - 1)
        if pattern:
            k = pattern.bit_length() - 1  # the indicator bit's position: k fraction bits below it
            decade = magnitude_bits - 1 - k  # the zero bits above it
            fraction = 0.1 + 0.9 * (pattern - 2**k + 0.5) / 2**k
            values[code] = fraction * 10.0**-decade
        if signed and code >> magnitude_bits:
            values[code] = -values[code] if pattern else 1.0  # (-0 would repeat 0: 1, a block's absmax exact)
    return values


def linear_map(bits: int) -> np.ndarray:
    """The linear map without zero of Li et al.: code ``i`` stands for ``(i + 1) / 2**bits`` (float64)."""
    return (np.arange(2**bits) + 1.0) / 2**bits


def _map(bits: int, signed: bool) -> np.ndarray:
    """The values a leaf stored in ``bits`` bits can take, sorted: its codes are their ranks."""
    return np.sort(linear_map(4) if (bits == 4 and not signed) else dynamic_map(bits, signed))


# --------------------------------------------------------------------------
# Codes


def _encode(normalized: jax.Array, bits: int, signed: bool) -> jax.Array:
    """The rank (uint8) of the nearest value of the map to each element, ties to the smaller: the code computed
    arithmetically (:func:`_below`), then one comparison with the float32 midpoint above it. Equal to counting
    the map's float32 midpoints below the element (what a search over them gives), NaN to code 0."""
    values = _map(bits, signed).astype(np.float32)
    mids = np.append((values[1:] + values[:-1]) / 2, np.inf).astype(np.float32)
    low = _below(normalized, bits, signed)
    if bits == 4 and not signed:  # (the linear map's midpoints (2 r + 3) / 32, exact, as is 32 x)
        above = jnp.clip(normalized, -1.0, 2.0) * np.float32(32) > (2 * low + 3).astype(jnp.float32)
    else:
        above = normalized > _lookup(mids, low)
    code = jnp.minimum(low + above.astype(jnp.int32), 2**bits - 1)
    return jnp.where(jnp.isnan(normalized), 0, code).astype(jnp.uint8)


def _below(x: jax.Array, bits: int, signed: bool) -> jax.Array:
    """A rank (int32) ``r`` of the sorted map whose value or its upper neighbour is the nearest to each element
    of ``x``: the rank of the largest map value not above it, computed arithmetically. Its float32 rounding
    moves it by one only within a few roundings of a map value, where the nearest is that value and both ranks
    around it lead there.

    - linear map without zero: value ``(i + 1) / 16`` at rank ``i``, so ``floor(16 x) - 1``.
    - dynamic map, ``M`` magnitude bits: the magnitude ``m`` in the decade ``d`` (``10**-(d+1) <= m < 10**-d``,
      the last decade taking everything below it) has ``k = M - 1 - d`` fraction bits, its bins' centres
      ``c_j = (0.1 + 0.9 (j + 1/2) / 2**k) 10**-d`` at the pattern ``2**k + j`` (the patterns sorted as their
      values): below ``m``, ``j = floor((m 10**d - 0.1) 2**k / 0.9 - 1/2)``; a ``j`` of -1 is the decade
      below's largest centre (pattern ``2**k - 1``), so the formula runs on across decades. Signed: the
      positives at ranks ``2**M - 1 + pattern`` (0 at ``2**M - 1``, 1 at the top), the negatives mirrored below
      0, where the largest value not above ``-m`` is the one whose magnitude is one pattern above ``m``'s.
    """
    top = 2**bits - 1
    if bits == 4 and not signed:
        low = jnp.floor(jnp.clip(x, -1.0, 2.0) * np.float32(16)) - 1
        return jnp.clip(jnp.where(jnp.isnan(low), 0, low), 0, top).astype(jnp.int32)
    magnitude_bits = bits - 1 if signed else bits
    m = jnp.abs(x) if signed else x  # (an unsigned map's negative values fall to code 0)
    m = jnp.clip(m, -1.0, 2.0)
    scale = jnp.ones_like(m)  # 10**d
    slope = jnp.full_like(m, np.float32(2.0 ** (magnitude_bits - 1) / 0.9))  # 2**k / 0.9
    base = jnp.full_like(m, np.float32(2.0 ** (magnitude_bits - 1)))  # 2**k
    for d in range(1, magnitude_bits):  # (nested thresholds: the last one below which m lies wins)
        below = m < np.float32(10.0**-d)
        k = magnitude_bits - 1 - d
        scale = jnp.where(below, np.float32(10.0**d), scale)
        slope = jnp.where(below, np.float32(2.0**k / 0.9), slope)
        base = jnp.where(below, np.float32(2.0**k), base)
    j = jnp.floor((m * scale - np.float32(0.1)) * slope - np.float32(0.5))
    pattern = jnp.clip(base + j, 0, 2**magnitude_bits - 1)
    pattern = jnp.where(jnp.isnan(pattern), 0, pattern).astype(jnp.int32)
    if not signed:
        return pattern
    zero = 2**magnitude_bits - 1
    return jnp.clip(jnp.where(x < 0, zero - 1 - pattern, zero + pattern), 0, top)


def _encode_stochastic(x: jax.Array, bits: int, signed: bool, uniform: jax.Array) -> jax.Array:
    """The code (uint8) of one of the two map values around each element, the upper with probability
    proportional to the element's distance from the lower, so that the value stored is the element in
    expectation (stochastic rounding). ``uniform``: float32 draws in [0, 1), ``x``'s shape. Below the map's
    smallest value (the linear map's 1/16) the smallest is stored, above its largest the largest; NaN takes code
    0. A map value is stored as it is."""
    top = 2**bits - 1
    low = _below(x, bits, signed)  # (the largest value not above x, or one rank off within roundings of one)
    low = low + (x >= _value(low + 1, bits, signed)).astype(jnp.int32) - (x < _value(low, bits, signed)).astype(
        jnp.int32)
    low = jnp.clip(low, 0, top - 1)
    lo, hi = _value(low, bits, signed), _value(low + 1, bits, signed)
    up = uniform < jnp.clip((x - lo) / (hi - lo), 0.0, 1.0)
    return jnp.where(jnp.isnan(x), 0, low + up.astype(jnp.int32)).astype(jnp.uint8)


def _value(rank: jax.Array, bits: int, signed: bool) -> jax.Array:
    """The map's value of each ``rank`` (int32, 0 .. 2**bits), +inf past the largest."""
    if bits == 4 and not signed:
        return jnp.where(rank > 15, np.float32(np.inf), (rank + 1).astype(jnp.float32) * np.float32(1 / 16))
    return _lookup(np.append(_map(bits, signed).astype(np.float32), np.float32(np.inf)), rank)


def _float8_stochastic(y: jax.Array, uniform: jax.Array) -> jax.Array:
    """``y`` (float32, within float8_e4m3fn's range) as float8_e4m3fn rounded stochastically: its magnitude
    between the two float8 magnitudes around it (consecutive bit patterns, 0 to 0x7E), the upper with probability
    proportional to the distance from the lower, the sign kept."""
    magnitude = jnp.abs(y)
    nearest = magnitude.astype(jnp.float8_e4m3fn)
    pattern = jax.lax.bitcast_convert_type(nearest, jnp.uint8)
    low = jnp.where(nearest.astype(jnp.float32) > magnitude, pattern - 1, pattern)
    high = jnp.minimum(low + 1, 0x7E).astype(jnp.uint8)
    lo = jax.lax.bitcast_convert_type(low, jnp.float8_e4m3fn).astype(jnp.float32)
    hi = jax.lax.bitcast_convert_type(high, jnp.float8_e4m3fn).astype(jnp.float32)
    chance = jnp.where(hi > lo, (magnitude - lo) / jnp.where(hi > lo, hi - lo, 1.0), 0.0)
    chosen = jnp.where(uniform < chance, high, low) | jnp.where(y < 0, np.uint8(0x80), np.uint8(0))
    out = jax.lax.bitcast_convert_type(chosen.astype(jnp.uint8), jnp.float8_e4m3fn)
    return jnp.where(jnp.isnan(y), y.astype(jnp.float8_e4m3fn), out)


def _uniform(bits: jax.Array) -> jax.Array:
    """Uniform float32 draws in [0, 1) on a grid of 2**-24 from uint32 random bits (their top 24)."""
    return (bits >> 8).astype(jnp.float32) * np.float32(2.0**-24)


def _decode(codes: jax.Array, bits: int, signed: bool) -> jax.Array:
    """The value of each code: the linear map's ``(i + 1) / 16`` computed (exact in float32), a dynamic map's
    looked up in its table."""
    if bits == 4 and not signed:
        return (codes.astype(jnp.int32) + 1).astype(jnp.float32) * np.float32(1 / 16)
    return _lookup(_map(bits, signed), codes.astype(jnp.int32))


def _lookup(values: np.ndarray, index: jax.Array) -> jax.Array:
    """``values[index]`` in float32, the table replicated over the mesh of ``index`` and the result placed like
    it (on an Explicit mesh, a gather must be told both)."""
    table = _tree.place_like(jnp.asarray(values.astype(np.float32)), index, dims=(None,))
    sharding = _tree.sharding_like(index)
    explicit = isinstance(sharding, NamedSharding) and AxisType.Explicit in sharding.mesh.axis_types
    return table.at[index].get(out_sharding=sharding) if explicit else table[index]


def _pack(codes: jax.Array) -> jax.Array:
    """Two 4-bit codes per byte along the last axis, the first in the low half (an odd last axis padded with a
    code 0). Each pair read as one 16-bit word (a bitcast: the first byte its low one, on every platform JAX
    runs on), which XLA fuses into the codes' kernel without the slow strided reads of slicing the pairs."""
    if codes.shape[-1] % 2:
        codes = jnp.pad(codes, [(0, 0)] * (codes.ndim - 1) + [(0, 1)])
    words = jax.lax.bitcast_convert_type(codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2), jnp.uint16)
    return ((words & 15) | ((words >> 8) << 4)).astype(jnp.uint8)


def _unpack(packed: jax.Array, last: int) -> jax.Array:
    words = (packed & 15).astype(jnp.uint16) | ((packed >> 4).astype(jnp.uint16) << 8)
    codes = jax.lax.bitcast_convert_type(words, jnp.uint8)
    return codes.reshape(*packed.shape[:-1], 2 * packed.shape[-1])[..., :last]


# --------------------------------------------------------------------------
# Blocks and normalizers


def _as_rows(x: jax.Array) -> jax.Array:
    return x.reshape(1) if x.ndim == 0 else x


def _split_last(x: jax.Array) -> tuple[Any, int]:
    """The sharding of ``x`` and the number of shards its last axis is split in, where it is split over the
    axes of an Explicit mesh (where a reshape must be told its output's sharding); ``(None, 1)`` otherwise (one
    device, an unsplit last axis, or an Auto mesh, whose placement XLA propagates)."""
    sharding = _tree.sharding_like(x)
    if not isinstance(sharding, NamedSharding) or x.ndim == 0:
        return None, 1
    spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
    names = spec[-1] if isinstance(spec[-1], tuple) else (spec[-1],)
    types = dict(zip(sharding.mesh.axis_names, sharding.mesh.axis_types))
    if spec[-1] is None or any(types[n] != AxisType.Explicit for n in names):
        return None, 1
    return sharding, math.prod(sharding.mesh.shape[n] for n in names)


class _Blocks(NamedTuple):
    """A leaf's last axis in blocks: ``parts`` of shape ``(..., blocks * per, part)``, each block ``per``
    consecutive parts of ``part`` elements (``per`` is 1, a part a whole block, unless the last axis is split in
    shards that hold less than a block, or not a whole number of blocks: then a part is the largest run of
    elements dividing both, so that no part straddles a shard), and ``last``, the axis' length before the
    padding of its last block."""

    parts: jax.Array
    per: int
    last: int


def _blocked(x: jax.Array, block: int) -> _Blocks:
    """``x`` (at least 1-d) in blocks of ``block`` consecutive elements of its last axis (a row shorter than a
    block is one block), the last block of a row padded with zeros."""
    last = x.shape[-1]
    block = max(1, min(block, last))
    count = -(-last // block)
    pad = count * block - last
    if pad:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    sharding, shards = _split_last(x)
    if sharding is None:
        return _Blocks(x.reshape(*x.shape[:-1], count, block), 1, last)
    part = math.gcd(block, count * block // shards)
    spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
    out = NamedSharding(sharding.mesh, PartitionSpec(*spec, None))
    parts = jax.lax.reshape(x, (*x.shape[:-1], count * block // part, part), out_sharding=out)
    return _Blocks(parts, block // part, last)


def _block_absmax(b: _Blocks) -> jax.Array:
    """Each block's absolute maximum, ``(..., blocks)``: a part's, then (a block of several parts) the largest
    of its parts' (exact: a maximum is one of the values, whatever the order)."""
    absmax = jnp.max(jnp.abs(b.parts), axis=-1)
    if b.per == 1:
        return absmax
    sharding = _tree.sharding_like(absmax)
    spec = tuple(sharding.spec)[:-1] + (None, None)  # (a few floats per block: gathered to the block's shards)
    shape = (*absmax.shape[:-1], absmax.shape[-1] // b.per, b.per)
    return jnp.max(jax.lax.reshape(absmax, shape, out_sharding=NamedSharding(sharding.mesh,
                                                                            PartitionSpec(*spec))), axis=-1)


def _per_part(scales: jax.Array, b: _Blocks) -> jax.Array:
    """Each block's ``scales`` (``(..., blocks)``) as a column against ``b.parts``: ``(..., blocks * per, 1)``,
    placed like the parts."""
    if b.per > 1:
        scales = _tree.place_like(jnp.repeat(scales, b.per, axis=-1), b.parts, dims=tuple(range(b.parts.ndim - 1)))
    return scales[..., None]


def _unblocked(x: jax.Array, last: int) -> jax.Array:
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])[..., :last]


def _safe(scale: jax.Array) -> jax.Array:
    """A scale to divide by: 1 where it is 0 (an all-zero block, whose elements stay 0)."""
    return jnp.where(scale > 0, scale, jnp.ones_like(scale))


def _rank1(x: jax.Array) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """Li et al.'s rank-1 normalization of a non-negative ``x`` (at least 2-d): the maximum along each axis
    (over all the others), and the normalizer of each element, the smallest of its axes' maxima."""
    maxima = tuple(jnp.max(x, axis=tuple(a for a in range(x.ndim) if a != axis)) for axis in range(x.ndim))
    return maxima, _normalizer(maxima)


def _normalizer(maxima: tuple[jax.Array, ...]) -> jax.Array:
    ndim = len(maxima)
    shaped = [m.reshape([-1 if a == axis else 1 for a in range(ndim)]) for axis, m in enumerate(maxima)]
    out = shaped[0]
    for m in shaped[1:]:
        out = jnp.minimum(out, m)
    return out


class _Format(NamedTuple):
    """How one leaf is stored: ``bits`` (8, 4, or "float8"), ``signed``, the ``block`` size, and ``rank1``
    (4-bit second moments of at least 2 axes)."""

    bits: Any
    signed: bool
    block: int
    rank1: bool


#: The largest finite float8_e4m3fn.
_E4M3_MAX = 448.0


def quantize(x: jax.Array, fmt: _Format, random: jax.Array | None = None) -> QuantizedArray:
    """``x`` stored in ``fmt`` (its values in float32), rounded to nearest, or stochastically by ``random``
    (uint32 bits of ``x``'s shape, a scalar's of shape (1,)). A constant to derivatives: the codes are a rounding,
    whose derivative is zero where it is defined."""
    x = _as_rows(jax.lax.stop_gradient(jnp.asarray(x, jnp.float32)))

    def encode(normalized, bits, signed):
        if random is None:
            return _encode(normalized, bits, signed)
        return _encode_stochastic(normalized, bits, signed, _uniform(random))

    if fmt.rank1:
        scales, normalizer = _rank1(x)
        codes = encode(x / _safe(normalizer), 4, False)
        return QuantizedArray(_pack(codes), scales)
    blocks = _blocked(x, fmt.block)
    absmax = _block_absmax(blocks)
    normalized = _unblocked(blocks.parts / _per_part(_safe(absmax), blocks), x.shape[-1])
    if fmt.bits == "float8":
        scaled = normalized * _E4M3_MAX
        if random is not None:
            return QuantizedArray(_float8_stochastic(scaled, _uniform(random)), absmax)
        return QuantizedArray(scaled.astype(jnp.float8_e4m3fn), absmax)
    codes = encode(normalized, fmt.bits, fmt.signed)
    return QuantizedArray(_pack(codes) if fmt.bits == 4 else codes, absmax)


def _dequantize(q: QuantizedArray, fmt: _Format, shape: tuple, dtype: Any) -> jax.Array:
    last = 1 if not shape else shape[-1]
    if fmt.rank1:
        x = _decode(_unpack(q.codes, last), 4, False) * _normalizer(tuple(q.scales))
    else:
        if fmt.bits == "float8":
            normalized = q.codes.astype(jnp.float32) / _E4M3_MAX
        else:
            codes = _unpack(q.codes, last) if fmt.bits == 4 else q.codes
            normalized = _decode(codes, fmt.bits, fmt.signed)
        blocks = _blocked(normalized, fmt.block)
        x = _unblocked(blocks.parts * _per_part(q.scales, blocks), last)
    return x.reshape(shape).astype(dtype)


def _format(bits: Any, signed: bool, block_size: int | None, ndim: int) -> _Format:
    rank1 = bits == 4 and not signed and ndim >= 2
    default = 2048 if bits == 8 else 128
    return _Format(bits, signed, default if block_size is None else block_size, rank1)


# --------------------------------------------------------------------------
# The walk over a pipeline's state: every declared field, by its state path


def _map_fields(pipeline: Update, state: Any, fn, prefix: str = "") -> Any:
    """``state`` (of ``pipeline``) with every field of every stage's state NamedTuple, wrappers' and groups'
    pipelines included, replaced by ``fn(path, declaration, value)`` (``path`` as
    :meth:`updax.Update.get_state` reads it, ``declaration`` the field's ``Quantizable`` or None). A
    wrapper's field holding its pipeline's state is walked into, not given to ``fn``."""
    labels = [stage.label for stage in pipeline.stages]
    out = []
    for stage, entry in zip(pipeline.stages, state):
        label = stage.label
        if labels.count(label) > 1:
            label += f"[{labels[:len(out)].count(label)}]"
        own = entry.state if isinstance(entry, ScheduledState) else entry
        if hasattr(own, "_fields"):
            nested = stage.nested()
            inside = {field for field, _ in nested.values()}
            new = {}
            for field in own._fields:
                value = getattr(own, field)
                if field in inside:
                    if None in nested:
                        new[field] = _map_fields(nested[None][1], value, fn, f"{prefix}{label}/")
                    else:
                        new[field] = {key: _map_fields(nested[key][1], value[key], fn, f"{prefix}{label}/{key}/")
                                      for key in value}
                else:
                    new[field] = fn(f"{prefix}{label}.{field}", field_quantizable(type(own), field), value)
            own = own._replace(**new)
        out.append(entry._replace(state=own) if isinstance(entry, ScheduledState) else own)
    return tuple(out)


# --------------------------------------------------------------------------
# The wrapper


def _plan(inner, abstract, *, bits, block_size, min_size, formats, rounding="nearest", call="quantized_state"):
    """``{path: (declaration, bits or None)}`` for every field of the abstract state, the ``formats`` asked
    for checked against them; refuses by name what cannot be quantized."""
    found = {}

    def visit(path, declared, value):
        found[path] = (declared, value)
        return value

    _map_fields(inner, abstract, visit)
    asked = dict(formats or {})
    unknown = sorted(set(asked) - set(found))
    if unknown:
        fail(call, "formats", asked, f"names {unknown}, which are not state fields of the pipeline (its fields: "
             f"{sorted(found)})")
    plan = {}
    for path, (declared, value) in found.items():
        leaves = jax.tree.leaves(value)
        floating = all(jnp.issubdtype(x.dtype, jnp.floating) for x in leaves)
        want = asked.get(path, bits if declared is not None else None)
        if path in asked and want is not None:
            if not floating:
                kinds = sorted({x.dtype.name for x in leaves})
                fail(call, "formats", asked, f"asks to quantize {path}, an integer field ({', '.join(kinds)}); "
                     "only floating fields can be quantized")
            if declared is None:
                fail(call, "formats", asked, f"asks to quantize {path}, which its stage does not declare "
                     "quantizable (MomentField or SecondMomentField)")
        if declared is not None and want is not None and not floating:
            bad = sorted({x.dtype.name for x in leaves if not jnp.issubdtype(x.dtype, jnp.floating)})
            raise TypeError(f"{call}: {path} is declared quantizable but holds {', '.join(bad)} leaves; only "
                            "floating fields can be quantized")
        plan[path] = (declared, want)
    return plan


def _transform(inner, state, abstract, plan, *, block_size, min_size, to_storage, random=None):
    """``state`` with each eligible leaf quantized (``to_storage``) or dequantized, the ``abstract`` float state
    giving each leaf's shape and dtype. ``random``: quantize the ``i``-th eligible leaf (in the walk's order)
    stochastically with the bits ``random(i, x)`` (None: to nearest)."""
    stored = []
    flat_abstract = {}

    def record(path, declared, value):
        flat_abstract[path] = value
        return value

    _map_fields(inner, abstract, record)

    def convert(path, declared, value):
        _, bits = plan[path]
        if bits is None:
            return value

        def leaf(like, x):
            if math.prod(like.shape) < min_size or not jnp.issubdtype(like.dtype, jnp.floating):
                return x
            fmt = _format(bits, declared.signed, block_size, len(like.shape))
            if not to_storage:
                return _dequantize(x, fmt, like.shape, like.dtype)
            stored.append(path)
            return quantize(x, fmt, None if random is None else random(len(stored) - 1, _as_rows(x)))

        return jax.tree.map(leaf, flat_abstract[path], value)

    return _map_fields(inner, state, convert)


def _abstract(inner, like):
    return jax.eval_shape(inner.init, like)


def _init_quantized_state(params, *, inner, bits, block_size, min_size, formats, rounding):
    state = inner.init(params)
    abstract = _abstract(inner, params)
    plan = _plan(inner, abstract, bits=bits, block_size=block_size, min_size=min_size, formats=formats)
    count = jnp.zeros((), jnp.uint32) if rounding == "stochastic" else None
    return QuantizedState(inner=_transform(inner, state, abstract, plan, block_size=block_size,
                                           min_size=min_size, to_storage=True), count=count)


#: Mixed with the step count into stochastic rounding's seeds, so that its bits are not apply_updates' bits for
#: a key of the same count.
_SALT = 0x51A7E0F5


def _count_eligible(inner, abstract, plan, *, min_size):
    """How many leaves of the state are stored quantized."""
    found = []

    def visit(path, declared, value):
        if plan[path][1] is not None:
            found.extend(x for x in jax.tree.leaves(value)
                         if math.prod(x.shape) >= min_size and jnp.issubdtype(x.dtype, jnp.floating))
        return value

    _map_fields(inner, abstract, visit)
    return len(found)


def _apply_quantized_state(updates, state, params, *, inner, bits, block_size, min_size, formats, rounding,
                           **extra):
    real_only("quantized_state", updates)  # the maps code real numbers
    needing = [stage.label for stage in inner.stages if stage.reads_params()]
    if params is None and needing and jax.tree.leaves(updates):
        raise ValueError(f"quantized_state needs params ({needing[0]} reads them), but update() got none: call "
                         "update(updates, state, params)")
    abstract = _abstract(inner, updates if params is None else params)
    plan = _plan(inner, abstract, bits=bits, block_size=block_size, min_size=min_size, formats=formats)
    options = dict(block_size=block_size, min_size=min_size)
    values = _transform(inner, state.inner, abstract, plan, to_storage=False, **options)
    updates, values = inner.update(updates, values, params, **extra)
    if rounding == "nearest":
        return updates, QuantizedState(inner=_transform(inner, values, abstract, plan, to_storage=True, **options))
    # Each step's bits: a hash of the step count, each stored leaf's position and each element's index
    # (updax._rounding, as apply_updates draws them), so a jitted step needs no key.
    count = jnp.asarray(state.count, jnp.uint32)
    seeds = _rounding.leaf_seeds(jnp.stack([count, jnp.uint32(_SALT)]),
                                 list(range(_count_eligible(inner, abstract, plan, min_size=min_size))), updates)

    def random(i, x):
        return _rounding.random_bits(*seeds[i], x.shape, _tree.sharding_like(x))

    stored = _transform(inner, values, abstract, plan, to_storage=True, random=random, **options)
    return updates, QuantizedState(inner=stored, count=count + jnp.uint32(1))


def _block_size(call, name, value):
    if value is None:
        return None
    Integer(1).check(call, name, value)
    if value < 2 or value & (value - 1):
        fail(call, name, value, "must be a power of two >= 2 (or None: each format's default)")
    return value


_FORMAT_VALUES = (8, 4, "float8", None)


def _formats(call, name, value):
    if value is None:
        return None
    if not isinstance(value, dict):
        fail(call, name, value, "must be None or a dict {state field path: 8, 4, 'float8' or None}", TypeError)
    for key, fmt in value.items():
        if not isinstance(key, str) or "." not in key:
            fail(call, name, value, f"has the key {key!r}; a key is a state field's path, like "
                 "'scale_by_adam.nu'", TypeError)
        if not any(type(fmt) is type(c) and fmt == c for c in _FORMAT_VALUES):
            fail(call, name, value, f"gives {key} the format {fmt!r}; a format is 8, 4, 'float8' or None")
    return value


#: What quantized_state's options hold (all static: they choose the storage, not numbers of the rule).
_QUANTIZED_DOMAINS = dict(
    inner=Pipeline(), bits=OneOf((8, 4, "float8")), min_size=Integer(0), rounding=OneOf(("nearest", "stochastic")),
    block_size=Valid(rule=_block_size, text="must be None or a power of two >= 2"),
    formats=Valid(rule=_formats, text="must be None or a dict {state field path: 8, 4, 'float8' or None}"))


@combinator(wraps=True)
def quantized_state(inner: Update, bits: int | str = 8, block_size: int | None = None, min_size: int = 4096,
                    formats: dict[str, int | str | None] | None = None, rounding: str = "nearest") -> Update:
    r"""The pipeline before it, its moments stored in 8 or 4 bits (or float8) between steps.

    Each state field a stage declares quantizable (first moments
    ``MomentField``, second moments ``SecondMomentField``: the Adam family,
    RMSProp, Lion, AdaBelief, AMSGrad, Adan, AdEMAMix, Yogi, ...) is kept
    quantized; every other field (counts, sums, previous gradients, params
    copies), every leaf of fewer than ``min_size`` elements and every
    non-float leaf stays as it is. Inside the step each stored leaf is
    dequantized, the pipeline runs on the float values, and the new values
    are quantized again:

    $$
    \begin{align*}
    x &= Q^{-1}(c, s), \qquad (u, x') = \text{inner}(g, x), \qquad (c', s') = Q(x'),
    \end{align*}
    $$

    where $Q$ stores a block of values as codes $c$ and one float32 scale
    $s$, the block's absolute maximum: $c_i$ is the code of the map value
    nearest $x_i / s$.

    - ``bits=8``: the dynamic (tree) map of Dettmers et al., signed for
      first moments, unsigned for second moments, blocks of ``2048``
      elements: 1 byte and 4/2048 of a byte per element.
    - ``bits=4``: first moments with the signed 4-bit dynamic map in blocks
      of ``128``; second moments of at least 2 axes with Li et al.'s rank-1
      normalization ($x_{ij}$ divided by $\min(\max_j x_{ij}, \max_i
      x_{ij})$, one float32 per row and per column) and the linear map
      without zero $(i + 1)/16$ (a second moment quantized to 0 makes
      $1/\sqrt{\nu}$ explode); 1-axis second moments in blocks of ``128``.
      Two codes per byte.
    - ``bits="float8"``: ``float8_e4m3fn`` of $448 \, x_i / s$, blocks of
      ``128``.

    Blocks run along a leaf's last axis (a row shorter than a block is one
    block), so a block never straddles a shard of a leaf split along its
    other axes; split along its last axis, a block's scale is the largest
    of the maxima of its parts on each shard (exact: the numbers are one
    device's); rank-1 maxima of a split axis are a maximum over its shards
    (exact, so the numbers are those of one device). By default a value is
    rounded to the nearest value of its map. With
    ``rounding="stochastic"`` it is rounded to one of the two around it,
    $v_- \le x \le v_+$, the upper with probability
    $(x - v_-) / (v_+ - v_-)$, so that $\mathbb{E}[Q^{-1}(Q(x))] = x$
    within the map's range: an EMA's increments below half a code's step
    (a second moment with $\beta_2 = 0.999$) are kept in expectation
    rather than dropped on every step. Its random bits are a hash of a step
    count the state keeps, each stored leaf's position and each element's
    index (as :func:`~updax.apply_updates` draws them), so a jitted step
    needs no key. Either way a jitted step equals an eager one and a
    restored checkpoint resumes bit for bit. With :func:`flat_state`
    inside it (``opt.flat_state().quantized_state()``) the joined buffers are
    quantized block by block: many small leaves become one large one.
    Complex updates are refused (the maps code real numbers), and
    derivatives through steps take the stored state as a constant (a
    rounding's derivative is zero where it is defined).

    Args:
        bits: the storage of the quantizable fields, ``8``, ``4`` or
            ``"float8"``. Default: ``8``.
        block_size: the block size of block-wise formats, a power of two
            (at least 2); None: 2048 for 8 bits, 128 for 4 bits and float8.
            Default: ``None``.
        min_size: leaves of fewer elements stay in float, an integer >= 0.
            Default: ``4096``.
        formats: per field, by its state path inside the wrapper (as
            :meth:`~updax.Update.get_state` reads it after
            ``"quantized_state/"``), the format ``8``, ``4``, ``"float8"`` or
            None (kept in float), over ``bits``; only fields their stage
            declares quantizable, and never an integer one. Default: ``None``.
        rounding: ``"nearest"`` (the nearest map value) or
            ``"stochastic"`` (one of the two around, unbiased; the state
            keeps a step count for its bits). Default: ``"nearest"``.

    Returns:
        An update object with state ``QuantizedState(inner, count)``: the
        wrapped pipeline's state, each stored leaf a
        ``QuantizedArray(codes, scales)``, and the step count (uint32) of
        ``rounding="stochastic"`` (None otherwise).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.optimizers.adamw(1e-3).quantized_state(bits=8)
        >>> params = {"w": jnp.ones((64, 128)), "b": jnp.zeros(128)}
        >>> state = opt.init(params)
        >>> mu = opt.get_state(state, "quantized_state/scale_by_adam.mu")
        >>> mu["w"].codes.dtype, mu["w"].scales.shape, mu["b"].dtype  # (b: below min_size, kept)
        (dtype('uint8'), (64, 1), dtype('float32'))
        >>> grads = jax.tree.map(jnp.ones_like, params)
        >>> updates, state = jax.jit(opt.update)(grads, state, params)
        >>> bool(jnp.allclose(updates["w"], -1e-3))  # (a first step of Adam: -lr · sign)
        True

    References:
        Dettmers, Lewis, Shleifer, Zettlemoyer, 8-bit Optimizers via
        Block-wise Quantization, 2022 (arXiv:2110.02861). Li, Chen, Zhu,
        Memory Efficient Optimizers with 4-bit States, 2023
        (arXiv:2309.01507).
    """
    options = dict(inner=inner, bits=bits, block_size=block_size, min_size=min_size, formats=formats,
                   rounding=rounding)
    return stateful(_init_quantized_state, _apply_quantized_state, name="quantized_state", options=options,
                    domains={k: _QUANTIZED_DOMAINS[k] for k in options}, wraps="inner",
                    static=("bits", "block_size", "min_size", "formats", "rounding"))
