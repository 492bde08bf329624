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

A value is stored as the nearest value of its map (ties to the smaller),
its code that value's rank among the map's sorted values.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._combinators import combinator
from updax._domains import Integer, OneOf, Pipeline, Valid, fail, field_quantizable
from updax._primitives import stateful
from updax._stage import ScheduledState
from updax._update import Update
from updax.updates._kernels import real_only

__all__ = ["QuantizedArray", "QuantizedState", "dynamic_map", "linear_map", "quantized_state"]


class QuantizedState(NamedTuple):
    """The wrapped pipeline's state with each eligible leaf stored as a ``QuantizedArray`` (see
    :func:`quantized_state`)."""

    inner: tuple


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


def _encode(normalized: jax.Array, values: np.ndarray) -> jax.Array:
    """The rank (uint8) of the nearest of the sorted ``values`` to each element, ties to the smaller: a
    bisection over their midpoints, unrolled (one comparison and one lookup in a table of 2**bits per level)."""
    ranked = values.astype(np.float32)
    mids = np.append((ranked[1:] + ranked[:-1]) / 2, np.inf)
    step = len(values) // 2  # (the first level against one midpoint: a lookup at constant indices XLA would fold)
    index = jnp.where(normalized > np.float32(mids[step - 1]), step, 0).astype(jnp.int32)
    step //= 2
    while step:
        index = jnp.where(normalized > _lookup(mids, index + (step - 1)), index + step, index)
        step //= 2
    return index.astype(jnp.uint8)


def _decode(codes: jax.Array, values: np.ndarray) -> jax.Array:
    return _lookup(values, codes.astype(jnp.int32))


def _lookup(values: np.ndarray, index: jax.Array) -> jax.Array:
    """``values[index]`` in float32, the table replicated over the mesh of ``index`` and the result placed like
    it (on an Explicit mesh, a gather must be told both)."""
    table = _tree.place_like(jnp.asarray(values.astype(np.float32)), index, dims=(None,))
    sharding = _tree.sharding_like(index)
    return table[index] if sharding is None else table.at[index].get(out_sharding=sharding)


def _pack(codes: jax.Array) -> jax.Array:
    """Two 4-bit codes per byte along the last axis (an odd last axis padded with a code 0)."""
    if codes.shape[-1] % 2:
        codes = jnp.pad(codes, [(0, 0)] * (codes.ndim - 1) + [(0, 1)])
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def _unpack(packed: jax.Array, last: int) -> jax.Array:
    pairs = jnp.stack([packed & 15, packed >> 4], axis=-1)
    return pairs.reshape(*packed.shape[:-1], 2 * packed.shape[-1])[..., :last]


# --------------------------------------------------------------------------
# Blocks and normalizers


def _as_rows(x: jax.Array) -> jax.Array:
    return x.reshape(1) if x.ndim == 0 else x


def _blocked(x: jax.Array, block: int) -> jax.Array:
    """``x`` (at least 1-d) as ``(..., blocks, block)``: blocks of ``block`` consecutive elements of its last
    axis (a row shorter than a block is one block), the last block of a row padded with zeros."""
    last = x.shape[-1]
    block = max(1, min(block, last))
    count = -(-last // block)
    pad = count * block - last
    if pad:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    return x.reshape(*x.shape[:-1], count, block)


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


def quantize(x: jax.Array, fmt: _Format) -> QuantizedArray:
    """``x`` stored in ``fmt`` (its values in float32). A constant to derivatives: the codes are a rounding, whose
    derivative is zero where it is defined."""
    x = _as_rows(jax.lax.stop_gradient(jnp.asarray(x, jnp.float32)))
    if fmt.rank1:
        scales, normalizer = _rank1(x)
        codes = _encode(x / _safe(normalizer), _map(4, False))
        return QuantizedArray(_pack(codes), scales)
    blocks = _blocked(x, fmt.block)
    absmax = jnp.max(jnp.abs(blocks), axis=-1)
    normalized = _unblocked(blocks / _safe(absmax)[..., None], x.shape[-1])
    if fmt.bits == "float8":
        return QuantizedArray((normalized * _E4M3_MAX).astype(jnp.float8_e4m3fn), absmax)
    codes = _encode(normalized, _map(fmt.bits, fmt.signed))
    return QuantizedArray(_pack(codes) if fmt.bits == 4 else codes, absmax)


def _dequantize(q: QuantizedArray, fmt: _Format, shape: tuple, dtype: Any) -> jax.Array:
    last = 1 if not shape else shape[-1]
    if fmt.rank1:
        x = _decode(_unpack(q.codes, last), _map(4, False)) * _normalizer(tuple(q.scales))
    else:
        if fmt.bits == "float8":
            normalized = q.codes.astype(jnp.float32) / _E4M3_MAX
        else:
            codes = _unpack(q.codes, last) if fmt.bits == 4 else q.codes
            normalized = _decode(codes, _map(fmt.bits, fmt.signed))
        x = _unblocked(_blocked(normalized, fmt.block) * q.scales[..., None], last)
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


def _plan(inner, abstract, *, bits, block_size, min_size, formats, call="quantized_state"):
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


def _transform(inner, state, abstract, plan, *, block_size, min_size, to_storage):
    """``state`` with each eligible leaf quantized (``to_storage``) or dequantized, the ``abstract`` float state
    giving each leaf's shape and dtype."""
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
            return quantize(x, fmt) if to_storage else _dequantize(x, fmt, like.shape, like.dtype)

        return jax.tree.map(leaf, flat_abstract[path], value)

    return _map_fields(inner, state, convert)


def _abstract(inner, like):
    return jax.eval_shape(inner.init, like)


def _init_quantized_state(params, *, inner, bits, block_size, min_size, formats):
    state = inner.init(params)
    abstract = _abstract(inner, params)
    plan = _plan(inner, abstract, bits=bits, block_size=block_size, min_size=min_size, formats=formats)
    return QuantizedState(inner=_transform(inner, state, abstract, plan, block_size=block_size,
                                           min_size=min_size, to_storage=True))


def _apply_quantized_state(updates, state, params, *, inner, bits, block_size, min_size, formats, **extra):
    real_only("quantized_state", updates)  # the maps code real numbers
    needing = [stage.label for stage in inner.stages if stage.needs_params]
    if params is None and needing and jax.tree.leaves(updates):
        raise ValueError(f"quantized_state needs params ({needing[0]} reads them), but update() got none: call "
                         "update(updates, state, params)")
    abstract = _abstract(inner, updates if params is None else params)
    plan = _plan(inner, abstract, bits=bits, block_size=block_size, min_size=min_size, formats=formats)
    options = dict(block_size=block_size, min_size=min_size)
    values = _transform(inner, state.inner, abstract, plan, to_storage=False, **options)
    updates, values = inner.update(updates, values, params, **extra)
    return updates, QuantizedState(inner=_transform(inner, values, abstract, plan, to_storage=True, **options))


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
    inner=Pipeline(), bits=OneOf((8, 4, "float8")), min_size=Integer(0),
    block_size=Valid(rule=_block_size, text="must be None or a power of two >= 2"),
    formats=Valid(rule=_formats, text="must be None or a dict {state field path: 8, 4, 'float8' or None}"))


@combinator(wraps=True)
def quantized_state(inner: Update, bits: int | str = 8, block_size: int | None = None, min_size: int = 4096,
                    formats: dict[str, int | str | None] | None = None) -> Update:
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
    other axes; rank-1 maxima of a split axis are a maximum over its shards
    (exact, so the numbers are those of one device). Quantization is
    deterministic (round to nearest), so a jitted step equals an eager one
    and a restored checkpoint resumes bit for bit. With :func:`flat_state`
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

    Returns:
        An update object with state ``QuantizedState(inner)``: the wrapped
        pipeline's state, each stored leaf a ``QuantizedArray(codes, scales)``.

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
    options = dict(inner=inner, bits=bits, block_size=block_size, min_size=min_size, formats=formats)
    return stateful(_init_quantized_state, _apply_quantized_state, name="quantized_state", options=options,
                    domains={k: _QUANTIZED_DOMAINS[k] for k in options}, wraps="inner",
                    static=("bits", "block_size", "min_size", "formats"))
