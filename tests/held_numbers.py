"""Params and state after a few steps of every registry entry and every optimizer, eager and jitted.

``python tests/held_numbers.py`` writes them to ``tests/data/held_numbers.npz``;
``tests/test_held_numbers.py`` compares the library's numbers today with that
file. It was written by the library as it stood before the catalogue's
kernels were rewritten in their readable form and the backend's hints were
moved behind one seam (issue 39, at e6117aa), so that the rewrite can show it
changed no number beyond float32 rounding. An entry added later, or whose
registry options changed, has its numbers written when it was
(``python tests/held_numbers.py NAME``, which keeps every other entry's):
``cautious`` and ``add_decayed_weights`` (now with ``cautious=True``), MARS,
Shampoo, SOAP, Sophia and NorMuon at issue 41's first part; PSGD Kron, Shampoo again (its entry gained
``block_size``), and issue 43's first entries (the optax transforms, ``loss_scale``, MADGRAD, LaProp, AcProp and
the optax spellings) after it, `quantized_state` (issue 42), and GaLore, MoMo, MoMo-Adam and
``scale_by_multiplicative_lr`` (issue 43's second part), and GaLore with a base pipeline (issue 43, its
``base_optimizer``).
"""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import updax as ux  # noqa: E402
from checkpoint_cases import CASES  # noqa: E402
from compile_options import DEFAULT_COMPILE  # noqa: E402
from registry import ENTRIES, nested_tree, updates_for  # noqa: E402

PATH = pathlib.Path(__file__).parent / "data" / "held_numbers.npz"
STEPS = 4

#: Every registry entry, and every optimizer as ``optimizers/<name>``.
BUILDERS = {**ENTRIES, **{f"optimizers/{name}": build for name, build in CASES.items()}}


def run(name: str, jit: bool, user_compile: bool = True) -> tuple[dict[str, np.ndarray], list[str]]:
    """The params and the state after ``STEPS`` steps applied to the registry's nested params, by path; and every
    state leaf whose dtype or shape after a step differs from ``init``'s (``'step t path: before -> after'``).
    Jitted, ``user_compile`` compiles as a user's program is (as the numbers were written), else at the process's
    compile options (the tests' cheapest)."""
    opt = BUILDERS[name]()
    params = nested_tree(seed=0)
    state = opt.init(params)
    at_init = [(jax.tree_util.keystr(path), jax.typeof(x))
               for path, x in jax.tree_util.tree_flatten_with_path(state)[0]]

    traces = []

    def step(opt, grads, state, params):
        traces.append(1)
        updates, state = opt.update(grads, state, params, loss=1.0)
        return ux.apply_updates(params, updates), state

    if jit:
        step = jax.jit(step, compiler_options=DEFAULT_COMPILE) if user_compile else jax.jit(step)
    drift = []
    for t in range(STEPS):
        params, state = step(opt, updates_for(opt, nested_tree(seed=t + 1)), state, params)
        drift += [f"step {t + 1} {path}: {before.str_short()} -> {jax.typeof(x).str_short()}"
                  for (path, before), x in zip(at_init, jax.tree.leaves(state))
                  if (before.dtype, before.shape) != (x.dtype, x.shape)]
    if jit:  # one trace for every step, and for new values of the object's numbers (its leaves): no recompilation
        tweaked = jax.tree.map(lambda v: v * 0.9 if isinstance(v, float) else v, opt)
        assert jax.tree.structure(tweaked) == jax.tree.structure(opt)
        step(tweaked, updates_for(opt, nested_tree(seed=STEPS + 1)), state, params)
        if len(traces) != 1:
            drift.append(f"traced {len(traces)} times: a new step or new hyperparameters recompiled the step")
    out = {}
    for kind, tree in (("params", params), ("state", state)):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            out[f"{kind}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
    return out, drift


def key(name: str, jit: bool) -> str:
    return f"{name}|{'jit' if jit else 'eager'}"


def record(names=()) -> None:
    """Writes every builder's numbers; with ``names``, those builders' only (a new entry, or an entry whose
    registry options changed), keeping every other builder's numbers as they were held."""
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        raise SystemExit(f"no builder named {unknown}")
    arrays = {}
    if names:
        with np.load(PATH) as held:
            arrays = {k: held[k] for k in held.files if k.split("|")[0] not in names}
    for name in sorted(names or BUILDERS):
        for jit in (False, True):
            for path, value in run(name, jit)[0].items():
                arrays[f"{key(name, jit)}|{path}"] = value
    PATH.parent.mkdir(exist_ok=True)
    np.savez_compressed(PATH, **arrays)
    print(f"{len(arrays)} arrays ({', '.join(sorted(names)) or f'{len(BUILDERS)} builders'}) written to {PATH}")


if __name__ == "__main__":  # python tests/held_numbers.py [NAME ...]
    record(tuple(sys.argv[1:]))
