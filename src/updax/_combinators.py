"""The combinator registry: Axon's optional leading combinator and the fluent method, written once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, overload

from updax._hints import check_keywords
from updax._stage import reserve_name
from updax._update import Update

__all__ = ["Combinator", "combinator", "registered"]

P = ParamSpec("P")

#: Attributes of update objects that a combinator may not take as its name.
_RESERVED = frozenset({"init", "update", "pipe", "get_state", "replace_state", "stages"})

#: name -> (the registered combinator, whether it is a wrapper: its factory takes the parent pipeline first)
_REGISTRY: dict[str, tuple[Callable[..., Update], bool]] = {}


class Combinator(Protocol[P]):
    """A registered combinator: called with its options, or with a leading parent pipeline and its options."""

    @overload
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Update: ...

    @overload
    def __call__(self, parent: Update, /, *args: P.args, **kwargs: P.kwargs) -> Update: ...


def registered() -> dict[str, tuple[Callable[..., Update], bool]]:
    """The registered combinators by name, each with whether it is a wrapper (a copy)."""
    return dict(_REGISTRY)


@overload
def combinator(factory: Callable[P, Update], /) -> Combinator[P]: ...


@overload
def combinator(*, wraps: Literal[False] = False,
               name: str | None = None) -> Callable[[Callable[P, Update]], Combinator[P]]: ...


@overload
def combinator(*, wraps: Literal[True],
               name: str | None = None) -> Callable[[Callable[Concatenate[Update, P], Update]], Combinator[P]]: ...


def combinator(factory: Callable[..., Update] | None = None, /, *, wraps: bool = False,
               name: str | None = None) -> Any:
    """Registers a combinator so that all four pipe forms work for it.

    ``factory(*args, **options)`` returns an :class:`Update`. The registered
    function also accepts a leading parent, ``f(parent, *args, **options)``,
    meaning ``parent`` then ``f``, and ``parent.f(*args, **options)`` becomes a
    method of every update object. With ``wraps=True`` the factory receives
    the parent (``identity()`` when none is given) as its first argument and
    decides how to run it, as :func:`updax.accumulate_gradients` does.

    A name can be registered once per process: registering another function
    under a taken name (the catalogue's included) raises, while running the
    same definition again (a reloaded module, a re-run notebook cell) replaces
    it. Names of :class:`Update`'s own attributes cannot be taken.

    Kernels are compared by identity, so define them once (at module level),
    not as a fresh lambda per call, or two equal-looking objects differ.

    Args:
        factory: the function returning an update object; when omitted,
            ``combinator(wraps=..., name=...)`` returns a decorator.
            Default: ``None``.
        wraps: the factory takes the parent pipeline as its first argument.
            Default: ``False``.
        name: the method name; None uses the factory's name. Default: ``None``.

    Returns:
        The registered combinator (or a decorator that registers one).

    Example:
        >>> import jax
        >>> import updax as ux
        >>> def negate(updates, params):
        ...     return jax.tree.map(lambda g: -g, updates)
        >>> @ux.combinator
        ... def flip_sign():
        ...     return ux.stateless(negate, name="flip_sign")
        >>> ux.scale(2.0).flip_sign() == flip_sign(ux.scale(2.0)) == ux.scale(2.0).pipe(flip_sign)
        True
    """

    def register(factory: Callable[..., Update]) -> Callable[..., Update]:
        if not callable(factory):
            raise TypeError(f"combinator({factory!r}): a combinator is a function returning an update object")
        fname = name or factory.__name__
        if not isinstance(fname, str) or not fname.isidentifier():
            raise ValueError(f"combinator(name={fname!r}): the name must be a Python identifier")

        @functools.wraps(factory)
        def build(*args: Any, **kwargs: Any) -> Update:
            check_keywords(fname, factory, kwargs)
            parent = None
            if args and isinstance(args[0], Update):
                parent, args = args[0], args[1:]
            if wraps:
                made = factory(Update() if parent is None else parent, *args, **kwargs)
            else:
                made = factory(*args, **kwargs)
            if not isinstance(made, Update):
                raise TypeError(f"combinator {fname} returned {type(made).__name__}, not an update object")
            if parent is None or wraps:
                return made
            return Update((*parent.stages, *made.stages))

        previous = _REGISTRY.get(fname, (None,))[0]
        if previous is None and (fname in _RESERVED or hasattr(Update, fname)):
            raise ValueError(f"cannot register combinator {fname!r}: it would hide Update.{fname}")
        origin = (factory.__module__, factory.__qualname__)
        if previous is not None and (previous.__module__, previous.__qualname__) != origin:
            # Re-running the same definition replaces it; another definition must not silently take
            # over a name everyone's pipelines use.
            raise ValueError(f"cannot register combinator {fname!r} from {origin[0]}: "
                             f"{previous.__module__}.{previous.__qualname__} already has that name")

        def method(self: Update, *args: Any, **kwargs: Any) -> Update:
            return build(self, *args, **kwargs)

        functools.update_wrapper(method, factory)
        setattr(Update, fname, method)
        _REGISTRY[fname] = (build, wraps)
        if (factory.__module__ or "").startswith("updax."):  # the catalogue's: its stage name is kept from import on
            reserve_name(fname, factory.__module__)
        return build

    return register if factory is None else register(factory)
