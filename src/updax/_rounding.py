"""Stochastic rounding: a float32 sum rounded at random to bfloat16 or float16, unbiased, for :func:`updax.apply_updates`.

A float32 value ``x`` between two neighbours ``lo < x < hi`` of the narrow
format rounds to ``hi`` with probability ``(x - lo) / (hi - lo)`` and to
``lo`` otherwise, so ``E[round(x)] = x``: an update below half a step of the
param's format moves the param in expectation, where rounding to nearest
drops it every time (Gupta et al. 2015, arXiv 1502.02551; Zamirai et al.
2020, arXiv 2010.06192). A representable ``x`` is returned as it is.

Both formats are rounded on the float32 bit pattern, with integers only: no
float arithmetic, so no flushing of subnormals and the same bits on every
backend, jitted or not.

- bfloat16 is float32 with the low 16 bits of the mantissa dropped: add 16
  uniform random bits to the pattern and truncate (the standard bit trick).
  The pattern is sign and magnitude, so a negative ``x`` rounds its
  magnitude the same way; a carry out of the mantissa steps the exponent
  (subnormals into normals, the largest bfloat16 into infinity); infinity
  stays itself and NaN is passed through.
- float16 drops 13 bits where it is normal, but more in its subnormal
  range (below ``2**-14`` its step is ``2**-24`` whatever float32's exponent),
  and its exponent is biased otherwise. The same rule on the 24-bit
  significand ``s``: with ``d`` bits dropped, ``k = s >> d`` steps of the
  target rounded down, plus one with probability ``(s mod 2**d) / 2**d``,
  decided by one 32-bit draw. That is exact for ``d <= 32``, that is for
  every ``|x| >= 2**-33``; below (under ``2**-9`` of float16's smallest
  step) the probability of rounding up is exact to ``2**-32``.
  ``|x| >= 65536`` and infinity give infinity, as rounding to nearest does.

The random bits (:func:`random_bits`) are a counter-based hash of the key's
data, the leaf's position and each element's index: computed in the sum's
kernel, with no buffer of bits, the same on one device as on a mesh, and a
few integer operations to compile. Each leaf's seeds reach its kernel from a
buffer (:func:`leaf_seeds`), computed once for all leaves.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from updax import _tree
from updax._backend import _apart

__all__ = ["ROUNDED", "leaf_seeds", "random_bits", "rounded", "stochastic_sum"]

ROUNDED = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))  # the formats rounded stochastically
_GOLDEN = 0x9E3779B9  # 2**32 / the golden ratio: SplitMix's step between counters


def leaf_seeds(words: jax.Array, positions: list[int], step: Any) -> list[tuple[jax.Array, jax.Array]]:
    """The seeds of :func:`random_bits` for the leaves at ``positions`` of a step that reads ``step``: pairs
    of uint32 scalars mixed from a key's data ``words`` and each leaf's position. In a jitted step they are the
    outputs of one kernel (:func:`updax._backend._apart.one_kernel_outputs`), read from buffers, rather than
    computed again in each leaf's kernel."""
    index = jnp.asarray(positions, jnp.uint32)
    seed, other = _mix(index * jnp.uint32(_GOLDEN) + jnp.uint32(1)), jnp.zeros(index.shape, jnp.uint32)
    for w in words:  # (a threefry key has two words, an rbg key four)
        seed, other = _mix(seed ^ w), _mix(other + seed)
    flat = _apart.one_kernel_outputs([*seed, *other], step)
    return list(zip(flat[:len(positions)], flat[len(positions):]))


@jax.jit
def stochastic_sum(p: jax.Array, u: jax.Array, seed: jax.Array, other: jax.Array) -> jax.Array:
    """``p + u`` in float32, rounded stochastically to ``p``'s dtype (one of :data:`ROUNDED`) by
    :func:`random_bits` of the leaf's seeds (:func:`leaf_seeds`). Jitted: one compiled program per leaf
    signature when called eagerly, the same operations inside a jitted step."""
    x = _tree.place_like(jax.lax.add(_tree.cast(p, jnp.float32), _tree.cast(u, jnp.float32)), p)
    bits = random_bits(seed, other, x.shape, _tree.sharding_like(p))
    return rounded(x, bits >> 16 if p.dtype == jnp.bfloat16 else bits, p.dtype)


def _mix(x: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser (Appleby), a bijection whose every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def random_bits(seed: jax.Array, other: jax.Array, shape: tuple[int, ...], sharding=None) -> jax.Array:
    """Uniform uint32 bits of ``shape``, one word per element, from a leaf's seeds (uint32 scalars,
    :func:`leaf_seeds`): a counter-based generator in the manner of SplitMix (Steele et al. 2014), each
    element's flat index stepped by the golden ratio from the seed, mixed, and xor'd with the other seed. Elementwise in an iota, so
    it computes in the sum's own kernel and on each shard its own slice (``sharding``: the leaf's, where one is
    known), with no buffer of bits, where ``jax.random.bits``' Threefry per leaf made an Adam step ten times as
    long, with full-size temporaries (docs/memory.md)."""
    flat, stride = jnp.uint32(0), 1
    for axis in reversed(range(len(shape))):
        flat = flat + jax.lax.broadcasted_iota(jnp.uint32, shape, axis, out_sharding=sharding) * jnp.uint32(stride)
        stride *= shape[axis]
    return _mix(flat * jnp.uint32(_GOLDEN) + seed) ^ other


def rounded(x: jax.Array, bits: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """The float32 ``x`` rounded stochastically to ``dtype`` by ``bits`` (uint32, ``x``'s shape): uniform
    in ``[0, 2**16)`` for bfloat16, in ``[0, 2**32)`` for float16."""
    pattern = jax.lax.bitcast_convert_type(x, jnp.uint32)
    if dtype == jnp.bfloat16:
        out = jax.lax.bitcast_convert_type(((pattern + bits) >> 16).astype(jnp.uint16), jnp.bfloat16)
    else:
        out = _float16(pattern, bits)
    return jnp.where(jnp.isnan(x), x.astype(dtype), out)


def _float16(pattern: jax.Array, r: jax.Array) -> jax.Array:
    """The float32 ``pattern`` rounded to float16 by the uniform 32-bit draws ``r`` (see the module)."""
    u32 = jnp.uint32
    magnitude = pattern & u32(0x7FFFFFFF)
    exponent = (magnitude >> 23).astype(jnp.int32)  # float32's biased exponent, 0 for zero and subnormals
    s = jnp.where(exponent > 0, (magnitude & u32(0x7FFFFF)) | u32(0x800000), magnitude)  # x = s * 2**(e - 150)
    # Bits dropped: 13 where float16 is normal; where it is subnormal its step 2**-24 is 2**(126 - e) units of s.
    dropped = jnp.maximum(13, 126 - jnp.maximum(exponent, 1))
    down = s >> jnp.minimum(dropped, 31).astype(u32)  # (s < 2**24: a shift of 31 leaves 0, as any of 24 or more)
    rest = s - (down << jnp.minimum(dropped, 31).astype(u32))
    # Round up when r < rest * 2**(32 - d), that is with probability rest / 2**d (for d > 32, floor'd).
    threshold = jnp.where(dropped <= 32, rest << jnp.clip(32 - dropped, 0, 31).astype(u32),
                          rest >> jnp.clip(dropped - 32, 0, 31).astype(u32))
    k = down + (r < threshold).astype(u32)
    # float16's pattern: its exponent field times 2**10 plus k, where k counts steps of 2**(e - 150 + d) and
    # includes the implicit bit (a carry of k into 2**11 steps the exponent; a subnormal's k reaches 2**10 at
    # the smallest normal, whose pattern that is).
    half = (jnp.maximum(exponent - 113, 0).astype(u32) << 10) + k
    half = jnp.where(magnitude >= u32(0x47800000), u32(0x7C00), half)  # |x| >= 2**16 (and inf): infinity
    sign = (pattern >> 16) & u32(0x8000)
    return jax.lax.bitcast_convert_type((half | sign).astype(jnp.uint16), jnp.float16)
