"""Placing optimizer state on many devices: the ZeRO-1 layout.

``opt.init(params)`` already creates each state leaf with its parameter's
sharding (see "Many devices" in docs/distributed.md). ZeRO-1 goes further
when the params are replicated over a data-parallel axis: each device keeps
only a slice of the optimizer state, updates only its slice, and
:func:`updax.apply_updates` gathers the update into the replicated params.
:func:`zero1_shardings` says where each state leaf goes.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from updax.updates._quantized import QuantizedArray

__all__ = ["zero1_shardings"]


def _axis_size(mesh: Any, axis: Any) -> int:
    names = axis if isinstance(axis, tuple) else (axis,)
    size = 1
    for name in names:
        size *= mesh.shape[name]
    return size


def _uses(spec: tuple, axis: Any) -> bool:
    names = set(axis) if isinstance(axis, tuple) else {axis}
    for entry in spec:
        if names & (set(entry) if isinstance(entry, tuple) else {entry}):
            return True
    return False


def zero1_shardings(tree: Any, mesh: Mesh, axis: str | tuple[str, ...] = "data") -> Any:
    """Where each leaf of ``tree`` goes to split it over ``axis`` of ``mesh`` as well: ZeRO-1's layout.

    Each array leaf keeps the axes its sharding already splits (a leaf that
    is not sharded over ``mesh`` counts as replicated) and is split over
    ``axis`` along its largest dimension that is not split yet and whose size
    ``axis`` divides. A leaf with no such dimension (a step count, a small
    bias) and a leaf already split over ``axis`` keep their sharding on
    ``mesh``. A :func:`updax.quantized_state` leaf's codes and scales are
    split together along an axis before the last, so that each device holds
    whole blocks with their scales (a 1-d leaf's along its axis when its
    blocks are full and divide evenly). Pass the result to
    ``jax.device_put`` to move an optimizer state there, and to
    ``jax.jit``'s ``in_shardings`` / ``out_shardings`` to keep it there
    across steps.

    Args:
        tree: any pytree of arrays or ``jax.ShapeDtypeStruct`` s (an
            optimizer state, usually). No default.
        mesh: the device mesh. No default.
        axis: the mesh axis (or tuple of axes) to split over. Default:
            ``"data"``.

    Returns:
        A pytree of ``NamedSharding`` s of ``tree``'s structure.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> mesh = jax.make_mesh((1,), ("data",))
        >>> opt = ux.optimizers.adam(1e-3)
        >>> state = opt.init({"w": jnp.zeros((4, 3)), "b": jnp.zeros(3)})
        >>> where = ux.sharding.zero1_shardings(state, mesh)
        >>> where[0].mu["w"].spec, where[0].count.spec
        (P('data', None), P())

    References:
        Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
        Trillion Parameter Models", SC 2020 (stage 1: optimizer state
        partitioning). https://arxiv.org/abs/1910.02054
    """
    call = "zero1_shardings"
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{call}: mesh must be a jax.sharding.Mesh (e.g. jax.make_mesh(...)), got "
                        f"{type(mesh).__name__}")
    for name in axis if isinstance(axis, tuple) else (axis,):
        if name not in mesh.axis_names:
            raise ValueError(f"{call}: axis {name!r} is not an axis of the mesh, whose axes are {mesh.axis_names}")
    size = _axis_size(mesh, axis)

    def current(x: Any) -> tuple:
        shape = tuple(getattr(x, "shape", ()))
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh.shape == mesh.shape:
            return tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
        return (None,) * len(shape)

    def split(spec: tuple, dims: list[int], shape: tuple) -> tuple:
        free = [i for i in dims if spec[i] is None and shape[i] > 0 and shape[i] % size == 0]
        if _uses(spec, axis) or not free:
            return spec
        best = max(free, key=lambda i: (shape[i], -i))
        return spec[:best] + (axis,) + spec[best + 1:]

    def place(x: Any) -> NamedSharding:
        shape = tuple(getattr(x, "shape", ()))
        return NamedSharding(mesh, PartitionSpec(*split(current(x), list(range(len(shape))), shape)))

    def place_quantized(q: QuantizedArray) -> QuantizedArray:
        # A quantized leaf's codes and scales are split together, so that each device holds whole blocks and
        # their scales: along an axis before the last (blocks run along the last axis), or along a 1-d leaf's
        # only axis when its blocks are all full and the devices get as many each.
        codes, scales = q.codes, q.scales
        spec = current(codes)
        if codes.ndim >= 2:
            spec = split(spec, list(range(codes.ndim - 1)), codes.shape)
        elif not isinstance(scales, tuple) and scales.shape[0] % size == 0 and codes.shape[0] % scales.shape[0] == 0:
            spec = split(spec, [0], codes.shape)
        if isinstance(scales, tuple):  # (rank-1: the maxima along each axis, split where that axis is)
            placed = tuple(NamedSharding(mesh, PartitionSpec(spec[a])) for a in range(len(scales)))
        else:
            placed = NamedSharding(mesh, PartitionSpec(*spec[:-1], spec[-1] if codes.ndim == 1 else None))
        return QuantizedArray(NamedSharding(mesh, PartitionSpec(*spec)), placed)

    return jax.tree.map(lambda x: place_quantized(x) if isinstance(x, QuantizedArray) else place(x), tree,
                        is_leaf=lambda x: isinstance(x, QuantizedArray))
