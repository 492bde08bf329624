"""The primitives everything is built on: ``stateless``, ``stateful``, ``identity``, ``compose``, ``apply_updates``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from updax import _rounding, _tree
from updax._combinators import combinator
from updax._domains import Domain, Relation
from updax._stage import Stage
from updax._update import Update

__all__ = ["apply_updates", "compose", "identity", "stateful", "stateless"]


@combinator
def stateless(apply_fn: Callable[..., Any], *, name: str | None = None, options: Mapping[str, Any] | None = None,
              domains: Mapping[str, Domain] | None = None, relations: Iterable[Relation] = (),
              needs_params: bool = False, static: Iterable[str] = (), schedulable: Iterable[str] = (),
              per_example: bool = False, elementwise: bool = False) -> Update:
    """A stage without state.

    Args:
        apply_fn: ``apply_fn(updates, params, **options) -> updates``; it gets
            the options its signature names, by keyword. No default.
        name: the name shown in ``repr`` and used in state paths, a Python
            identifier. A name binds its kernel, option names and
            declarations for the whole process, so that equal-looking stages
            compute the same. Default: ``None`` (shown as
            ``stateless(apply_fn, ...)``).
        options: a mapping of options, copied when the stage is built.
            Numbers and arrays are pytree leaves (a jitted step does not
            retrace when they change); other values are static and must be
            hashable or pytrees of hashable values. A callable option
            reaches the kernel as a function unless it is ``schedulable``.
            Every option must be a parameter of a kernel (unless a kernel
            takes ``**kwargs``): a misspelt one is refused. Default: ``None``.
        domains: what each option may hold, ``{option: Domain}`` (see
            :mod:`updax.domains`): checked when the stage is built, when a
            held value is written (``replace_state``) or read on an eager
            step, on the values a schedule returns, and on an object rebuilt
            by a tree map. An option without a domain is unchecked.
            Default: ``None``.
        relations: rules between options that no single domain says
            (:class:`updax.domains.Relation`), checked on the same paths.
            Default: ``()``.
        needs_params: raise a clear error when ``update`` gets no params.
            Default: ``False``.
        static: option names kept static (part of the compiled structure)
            even when numeric, e.g. an iteration count that fixes a Python
            loop in the kernel. Default: ``()``.
        schedulable: option names that may be schedules ``count -> value``:
            when such an option's value is callable, the stage evaluates it
            at its own step count and the kernel gets the number.
            Default: ``()``.
        per_example: the updates carry a leading axis of examples (one
            gradient per example, e.g. from ``jax.vmap(jax.grad(loss))``)
            and ``apply_fn`` reduces it: it returns updates shaped like the
            params. A pipeline holds at most one such stage, and its input
            updates are per-example (the stages before it see the axis).
            Default: ``False``.
        elementwise: ``apply_fn`` computes each element of the updates from
            the same element of its inputs and from scalars (its options, a
            step count, a reduction over all leaves together), whatever the
            leaves' shapes, so it may run on the leaves joined into one
            buffer (:func:`updax.flat_state`). Default: ``False``.

    Returns:
        An :class:`Update` with one stage.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> def negate(updates, params):
        ...     return jax.tree.map(lambda g: -g, updates)
        >>> opt = ux.stateless(negate)
        >>> opt
        stateless(negate)
        >>> opt.update({"w": jnp.array([1.0])}, opt.init(None))[0]
        {'w': Array([-1.], dtype=float32)}
    """
    stage = Stage(name, None, apply_fn, options or {}, needs_params=needs_params, static=static,
                  schedulable=schedulable, per_example=per_example, elementwise=elementwise, domains=domains,
                  relations=relations)
    return Update((stage,))


@combinator
def stateful(init_fn: Callable[..., Any], apply_fn: Callable[..., Any], *, name: str | None = None,
             options: Mapping[str, Any] | None = None, domains: Mapping[str, Domain] | None = None,
             relations: Iterable[Relation] = (), needs_params: bool = False, static: Iterable[str] = (),
             schedulable: Iterable[str] = (), wraps: str | None = None, per_example: bool = False,
             elementwise: bool = False, state_last: Iterable[str] = ()) -> Update:
    """A stage with state.

    Args:
        init_fn: ``init_fn(params, **options) -> state``, best a NamedTuple
            with descriptive fields. No default.
        apply_fn: ``apply_fn(updates, state, params, **options) -> (updates,
            state)``; each function gets the options its signature names.
            No default.
        name: the name shown in ``repr`` and used in state paths (see
            :func:`stateless`). Default: ``None`` (shown as
            ``stateful(init_fn, apply_fn, ...)``).
        options: a mapping of options (see :func:`stateless`).
            Default: ``None``.
        domains: what each option may hold (see :func:`stateless`).
            Default: ``None``.
        relations: rules between options (see :func:`stateless`).
            Default: ``()``.
        needs_params: raise a clear error when ``update`` gets no params.
            Default: ``False``.
        static: option names kept static even when numeric. Default: ``()``.
        schedulable: option names that may be schedules ``count -> value``
            (see :func:`stateless`). Default: ``()``.
        wraps: the option holding a pipeline this stage runs; its state must
            be stored in the state field of the same name. Composed after
            other stages with that option empty, the stage wraps them.
            Default: ``None``.
        per_example: the updates carry a leading axis of examples, which
            ``apply_fn`` reduces (see :func:`stateless`). Default: ``False``.
        elementwise: ``init_fn`` and ``apply_fn`` work element by element,
            the state included (see :func:`stateless`). Default: ``False``.
        state_last: fields of the state whose *old* values the updates
            ``apply_fn`` returns are computed from (Lion's sign reads the old
            momentum). Traced for the CPU with params given, their new values
            are written after the params' update, so that XLA updates their
            donated buffers in place where it would otherwise copy the old
            state first (see "The state in place" in docs/performance-xla.md).
            Only the numbers' order of computation changes. A wrapper stage
            may name its ``wraps`` field: when its pipeline is elementwise,
            every leaf of that pipeline's state shaped like a param is then
            written after that param (for a wrapper that computes the step
            on every call and selects between the new state and the old:
            :func:`apply_if_finite`, :func:`accumulate_gradients`), and
            otherwise the fields its stages declare, as in any wrapper.
            Default: ``()``.

    Returns:
        An :class:`Update` with one stage.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from typing import NamedTuple
        >>> import updax as ux
        >>> class CountState(NamedTuple):
        ...     count: jax.Array
        >>> def init(params):
        ...     return CountState(jnp.zeros([], jnp.int32))
        >>> def apply(updates, state, params, *, by):
        ...     return jax.tree.map(lambda g: g * by, updates), CountState(state.count + 1)
        >>> opt = ux.stateful(init, apply, name="counted_scale", options={"by": 2.0}, schedulable=["by"])
        >>> opt
        counted_scale(by=2.0)
        >>> updates, state = opt.update({"w": jnp.array([1.0])}, opt.init(None))
        >>> updates["w"], opt.get_state(state, "counted_scale.count")
        (Array([2.], dtype=float32), Array(1, dtype=int32))
    """
    stage = Stage(name, init_fn, apply_fn, options or {}, needs_params=needs_params, static=static,
                  schedulable=schedulable, wraps=wraps, per_example=per_example, elementwise=elementwise,
                  state_last=state_last, domains=domains, relations=relations)
    return Update((stage,))


@combinator
def identity() -> Update:
    """The empty pipeline: updates pass through unchanged.

    Like every combinator it takes an optional leading parent (Axon's
    ``identity/1``), which it returns unchanged.

    Returns:
        An :class:`Update` with no stages.

    Example:
        >>> import updax as ux
        >>> ux.identity()
        identity()
        >>> ux.identity(ux.scale(2.0)) == ux.scale(2.0).identity() == ux.scale(2.0)
        True
    """
    return Update()


def compose(*updates: Update) -> Update:
    """``a`` then ``b`` then ...: one pipeline whose state is the stages' states in order.

    A wrapper with nothing to wrap (``ux.apply_if_finite()``) composed after
    stages wraps them, so ``compose(a, ux.apply_if_finite())`` is
    ``a.apply_if_finite()``.

    Args:
        *updates: the update objects, in order. No default.

    Returns:
        An :class:`Update` with the stages of all of them.

    Example:
        >>> import updax as ux
        >>> ux.compose(ux.clip(delta=1.0), ux.scale(-0.1))
        clip(delta=1.0) |> scale(step_size=-0.1)
    """
    stages: list[Stage] = []
    for i, update in enumerate(updates):
        if not isinstance(update, Update):
            raise TypeError(f"compose: argument {i} is {type(update).__name__}, not an update object")
        stages.extend(update.stages)
    return Update(stages)


def apply_updates(params: Any, updates: Any, *, rounding: str = "nearest", key: Any = None) -> Any:
    r"""``params + updates``, leaf by leaf, keeping each param's dtype.

    The sum is computed in the wider of the two dtypes, then cast back. Each
    update must have its param's shape exactly (nothing is broadcast), params
    must be floating or complex, and a real param takes only real updates;
    otherwise the error names the leaf.

    With ``rounding="stochastic"``, each bfloat16 or float16 param's sum is
    taken in float32 and rounded at random to one of its two neighbours in
    the param's format, the upper one with probability
    $\frac{x - \lfloor x \rfloor}{\lceil x \rceil - \lfloor x \rfloor}$
    (Zamirai et al. 2020), so that

    $$ \mathbb{E}[\operatorname{round}(p + u)] = p + u $$

    and an update below half a step of the format (a bfloat16 param of 1
    has steps of $2^{-7}$) still moves the param in expectation, where
    rounding to nearest drops it on every step. A representable sum is
    exact; infinity and NaN pass through; a sum past the format's largest
    finite value may round to infinity, as to nearest. Leaves of float32
    and wider are summed as with ``"nearest"``; other formats narrower than
    float32 (float8) are refused by leaf. The random bits are a hash of
    ``key``, the leaf's position among the params' leaves and the element's
    index, computed inside the sum's kernel (no buffer of random bits), so
    leaves and elements draw apart. A step needs new bits: pass a new key on
    every step, or the step count the optimizer state already holds, and a
    jitted step takes no new argument::

        count = opt.get_state(state, "scale_by_adam.count")
        params = ux.apply_updates(params, updates, rounding="stochastic", key=count)

    Args:
        params: the parameters, any pytree of arrays. No default.
        updates: the updates, a pytree of the same structure. No default.
        rounding: how a sum is rounded to its param's dtype: ``"nearest"``
            (round to nearest even, as a cast does) or ``"stochastic"``.
            Default: ``"nearest"``.
        key: the random bits of ``"stochastic"``, which needs one (and
            ``"nearest"`` refuses one): a PRNG key (``jax.random.key``, or a
            raw ``jax.random.PRNGKey``), or an integer scalar such as a step
            count ``n``, which draws the bits of ``jax.random.PRNGKey(n)``.
            A key reused on every step rounds every step alike, which is
            biased over the steps. Default: ``None``.

    Returns:
        The new parameters, each leaf in its param's dtype and with its
        param's sharding (an update sharded otherwise is resharded).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> ux.apply_updates({"w": jnp.ones(2, jnp.bfloat16)}, {"w": jnp.full(2, 0.5)})
        {'w': Array([1.5, 1.5], dtype=bfloat16)}
        >>> params = {"w": jnp.ones(10_000, jnp.bfloat16)}
        >>> small = {"w": jnp.full(10_000, 2.0**-10)}  # an eighth of a step: to nearest, nothing moves
        >>> ux.apply_updates(params, small)["w"].astype(jnp.float32).mean()
        Array(1., dtype=float32)
        >>> moved = ux.apply_updates(params, small, rounding="stochastic", key=jax.random.key(0))
        >>> jnp.unique(moved["w"])  # about one in eight rounds up, one step of 2**-7
        Array([1, 1.00781], dtype=bfloat16)
        >>> round(float(moved["w"].astype(jnp.float32).mean() - 1) * 2**10, 2)  # in eighths of a step: 1 +- 0.03
        1.01

    References:
        P. Zamirai, J. Zhang, C. R. Aberger and C. De Sa, "Revisiting
        BFloat16 Training", 2020. https://arxiv.org/abs/2010.06192

        S. Gupta, A. Agrawal, K. Gopalakrishnan and P. Narayanan, "Deep
        Learning with Limited Numerical Precision", ICML 2015.
        https://arxiv.org/abs/1502.02551
    """
    if not isinstance(rounding, str) or rounding not in ("nearest", "stochastic"):
        raise ValueError(f"apply_updates(rounding={rounding!r}): rounding must be 'nearest' or 'stochastic'")
    if rounding == "nearest" and key is not None:
        raise ValueError("apply_updates(rounding='nearest'): a key was given, which only rounding='stochastic' "
                         "reads; pass rounding='stochastic' to round at random")
    words = _key_words(key) if rounding == "stochastic" else None

    def checked(where, p, u):
        p, u = jnp.asarray(p), jnp.asarray(u)
        leaf = f"params{jax.tree_util.keystr(where)}"
        if p.shape != u.shape:
            raise ValueError(f"apply_updates: {leaf} has shape {p.shape} but its update has shape {u.shape}; "
                             "shapes must match exactly (nothing is broadcast)")
        if not jnp.issubdtype(p.dtype, jnp.inexact):
            raise TypeError(f"apply_updates: {leaf} has dtype {p.dtype}: only floating or complex params can be "
                            "updated (the sum would be truncated); keep integer leaves out of the trained params")
        if jnp.issubdtype(u.dtype, jnp.complexfloating) and not jnp.issubdtype(p.dtype, jnp.complexfloating):
            raise TypeError(f"apply_updates: {leaf} is real ({p.dtype}) but its update is complex ({u.dtype}); "
                            "the imaginary part would be dropped")
        if words is not None and p.dtype.itemsize < 4 and p.dtype not in _rounding.ROUNDED:
            raise TypeError(f"apply_updates(rounding='stochastic'): {leaf} has dtype {p.dtype}; stochastic "
                            "rounding handles bfloat16 and float16 params (and sums float32 and wider ones as "
                            "they are)")
        return p, u

    _tree.check_same_structure("apply_updates", params, updates, "params", "updates")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    pairs = [checked(where, p, u) for (where, p), u in zip(leaves, treedef.flatten_up_to(updates))]
    rounded = [i for i, (p, _) in enumerate(pairs) if words is not None and p.dtype in _rounding.ROUNDED]
    seeds = dict(zip(rounded, _rounding.leaf_seeds(words, rounded, params))) if rounded else {}
    return treedef.unflatten([
        _tree.place_like(_rounding.stochastic_sum(p, u, *seeds[i]), p) if i in seeds else _tree.added(p, u)
        for i, (p, u) in enumerate(pairs)])


def _key_words(key: Any) -> jax.Array:
    """``apply_updates``' key as its data, uint32 words: a typed key's, a raw key as it is, an integer ``n`` as
    ``jax.random.PRNGKey(n)``'s ``(0, n)``; anything else is refused."""
    if key is None:
        raise ValueError("apply_updates(rounding='stochastic'): needs a key, new on every step: a PRNG key "
                         "(jax.random.key) or an integer step count (opt.get_state(state, 'scale_by_adam.count'))")
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"apply_updates(rounding='stochastic'): key must be one PRNG key, got keys of shape "
                             f"{key.shape}")
        return jax.random.key_data(key)
    try:
        array = jnp.asarray(key)
    except TypeError:
        array = None
    if array is not None and array.dtype == jnp.uint32 and array.ndim == 1 and array.size:
        return array  # (a raw jax.random.PRNGKey's words)
    if array is not None and array.shape == () and jnp.issubdtype(array.dtype, jnp.integer):
        return jnp.stack([jnp.uint32(0), array.astype(jnp.uint32)])
    raise TypeError(f"apply_updates(rounding='stochastic'): key must be a PRNG key (jax.random.key) or an integer "
                    f"scalar (a step count), got {type(key).__name__}"
                    + (f" of dtype {array.dtype} and shape {array.shape}" if array is not None else ""))
