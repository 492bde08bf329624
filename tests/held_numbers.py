"""Params and state after a few steps of every registry entry and every optimizer, eager and jitted.

``python tests/held_numbers.py`` writes them to ``tests/data/held_numbers.npz``;
``tests/test_held_numbers.py`` compares the library's numbers today with that
file. It was written by the library as it stood before the catalogue's
kernels were rewritten in their readable form and the backend's hints were
moved behind one seam (issue 39, at e6117aa), so that the rewrite can show it
changed no number beyond float32 rounding.
"""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import updax as ux  # noqa: E402
from checkpoint_cases import CASES  # noqa: E402
from registry import ENTRIES, nested_tree, updates_for  # noqa: E402

PATH = pathlib.Path(__file__).parent / "data" / "held_numbers.npz"
STEPS = 4

#: Every registry entry, and every optimizer as ``optimizers/<name>``.
BUILDERS = {**ENTRIES, **{f"optimizers/{name}": build for name, build in CASES.items()}}


def run(name: str, jit: bool) -> dict[str, np.ndarray]:
    """The params and the state after ``STEPS`` steps applied to the registry's nested params, by path."""
    opt = BUILDERS[name]()
    params = nested_tree(seed=0)
    state = opt.init(params)

    def step(opt, grads, state, params):
        updates, state = opt.update(grads, state, params, loss=1.0)
        return ux.apply_updates(params, updates), state

    step = jax.jit(step) if jit else step
    for t in range(STEPS):
        params, state = step(opt, updates_for(opt, nested_tree(seed=t + 1)), state, params)
    out = {}
    for kind, tree in (("params", params), ("state", state)):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            out[f"{kind}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
    return out


def key(name: str, jit: bool) -> str:
    return f"{name}|{'jit' if jit else 'eager'}"


def record() -> None:
    arrays = {}
    for name in sorted(BUILDERS):
        for jit in (False, True):
            for path, value in run(name, jit).items():
                arrays[f"{key(name, jit)}|{path}"] = value
    PATH.parent.mkdir(exist_ok=True)
    np.savez_compressed(PATH, **arrays)
    print(f"{len(arrays)} arrays from {len(BUILDERS)} builders written to {PATH}")


if __name__ == "__main__":
    record()
