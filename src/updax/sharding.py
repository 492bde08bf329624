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
    ``mesh``. Pass the result to ``jax.device_put`` to move an optimizer state
    there, and to ``jax.jit``'s ``in_shardings`` / ``out_shardings`` to keep
    it there across steps.

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

    def place(x: Any) -> NamedSharding:
        shape = tuple(getattr(x, "shape", ()))
        sharding = getattr(x, "sharding", None)
        spec: tuple = (None,) * len(shape)
        if isinstance(sharding, NamedSharding) and sharding.mesh.shape == mesh.shape:
            spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
        if not _uses(spec, axis):
            free = [i for i, n in enumerate(shape) if spec[i] is None and n > 0 and n % size == 0]
            if free:
                best = max(free, key=lambda i: (shape[i], -i))
                spec = spec[:best] + (axis,) + spec[best + 1:]
        return NamedSharding(mesh, PartitionSpec(*spec))

    return jax.tree.map(place, tree)
