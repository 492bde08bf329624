"""Trajectories: six updax optimizers on the Rosenbrock and Beale functions, drawn side by side in one PNG.

Run it from the repository root (needs the examples extra, for matplotlib: ``pip install -e '.[examples]'``)::

    python examples/trajectories.py                  # 3000 steps, writes docs/trajectories.png
    python examples/trajectories.py --quick          # 200 steps, a smoke run for CI
    python examples/trajectories.py --out /tmp/t.png

Both functions are classic test problems of unconstrained minimisation in two
variables, minimised here from the standard starting points of Moré, Garbow
and Hillstrom (1981), problems 1 and 5:

- Rosenbrock, f(x, y) = (1 - x)^2 + 100 (y - x^2)^2, from (-1.2, 1). A narrow
  curved valley along y = x^2: reaching the valley is easy, following it to
  the minimum 0 at (1, 1) is not.
- Beale, f(x, y) = (1.5 - x + xy)^2 + (2.25 - x + xy^2)^2 + (2.625 - x + xy^3)^2,
  from (1, 1). Flat near its minimum 0 at (3, 0.5), steep where |y| > 1.

Each optimizer keeps one learning rate on both functions, read back from the
optimizer object for the legend. The params are a pytree of two scalars,
``(x, y)``; one jitted function takes the optimizer object as an argument and
runs the steps with ``jax.lax.scan``, collecting the path. The script prints
each optimizer's pipeline, then a table with one row per function and
optimizer (the function at the start, at the final point, and the final
point's distance from the minimum), and writes the figure.

References:
    H. H. Rosenbrock, "An automatic method for finding the greatest or least
    value of a function", The Computer Journal 3(3):175-184, 1960.

    E. M. L. Beale, "On an iterative method for finding a local minimum of a
    function of more than one variable", Technical Report 25, Statistical
    Techniques Research Group, Princeton University, 1958.

    J. J. Moré, B. S. Garbow and K. E. Hillstrom, "Testing unconstrained
    optimization software", ACM Transactions on Mathematical Software
    7(1):17-41, 1981.

    M. Jamil and X.-S. Yang, "A literature survey of benchmark functions for
    global optimization problems", International Journal of Mathematical
    Modelling and Numerical Optimisation 4(2):150-194, 2013.
"""

import argparse
import functools
import pathlib
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

import updax as ux

STEPS = 3000
QUICK_STEPS = 200
DEFAULT_OUT = pathlib.Path(__file__).resolve().parent.parent / "docs" / "trajectories.png"


def rosenbrock(params):
    x, y = params
    return (1 - x) ** 2 + 100 * (y - x**2) ** 2


def beale(params):
    x, y = params
    return (1.5 - x + x * y) ** 2 + (2.25 - x + x * y**2) ** 2 + (2.625 - x + x * y**3) ** 2


class Problem(NamedTuple):
    fn: Callable
    title: str
    start: tuple  # Moré, Garbow and Hillstrom's starting point
    minimum: tuple
    xlim: tuple  # the plotted window
    ylim: tuple


PROBLEMS = {
    "rosenbrock": Problem(rosenbrock, r"Rosenbrock  $(1-x)^2 + 100\,(y-x^2)^2$",
                          start=(-1.2, 1.0), minimum=(1.0, 1.0), xlim=(-1.5, 1.5), ylim=(-0.4, 1.4)),
    "beale": Problem(beale, r"Beale  $(1.5-x+xy)^2 + (2.25-x+xy^2)^2 + (2.625-x+xy^3)^2$",
                     start=(1.0, 1.0), minimum=(3.0, 0.5), xlim=(0.4, 3.7), ylim=(-0.6, 1.4)),
}

# One learning rate per optimizer, the same on both functions, picked from a sweep of rates from 1e-4 to 1e-1 over
# 2000 steps. The Adam family gets 3e-2: near both minima, in steps of at most 0.04 (1e-1 gets there too, in jumps
# of up to 0.14). rmsprop and lion step by about the learning rate per coordinate whatever the size of the gradient,
# so they keep hopping around the minimum instead of settling: 3e-3 (at 1e-2 their final f on Rosenbrock is 4-6
# times higher). Momentum SGD follows the raw gradient, 215 in x at Rosenbrock's start: 1e-3, 30 times below Adam's.
OPTIMIZERS = {
    "adam": ux.optimizers.adam(3e-2),
    "adabelief": ux.optimizers.adabelief(3e-2),
    "yogi": ux.optimizers.yogi(3e-2),
    "sgd+momentum": ux.optimizers.sgd(1e-3, momentum=0.9),
    "rmsprop": ux.optimizers.rmsprop(3e-3),
    "lion": ux.optimizers.lion(3e-3, decay=0.0),  # no weight decay: every optimizer minimises the same function
}
COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
# The Adam family's paths nearly coincide: drawn first, widest first, each shows as a border of the next.
WIDTHS = [5.0, 3.2, 1.5, 2.0, 2.0, 1.2]
MARKED_STEPS = [100, 1000]  # a dot on each path where it is after 100 and 1000 steps


@functools.partial(jax.jit, static_argnames=("fn", "steps"))
def trajectory(opt, fn, start, steps):
    """The points visited by ``steps`` steps of ``opt`` on ``fn`` from ``start``, the start included: (steps + 1, 2)."""
    def step(carry, _):
        params, state = carry
        updates, state = opt.update(jax.grad(fn)(params), state, params)
        params = ux.apply_updates(params, updates)
        return (params, state), jnp.stack(params)

    params = (start[0], start[1])  # a pytree of two scalars
    _, points = jax.lax.scan(step, (params, opt.init(params)), length=steps)
    return jnp.concatenate([start[None], points])


def plot(paths, steps, out):
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)  # the Agg backend, without pyplot's global state
    marked = [n for n in MARKED_STEPS if n < steps]
    for ax, (name, problem) in zip(fig.subplots(1, 2), PROBLEMS.items()):
        x, y = np.meshgrid(np.linspace(*problem.xlim, 400), np.linspace(*problem.ylim, 400))
        z = problem.fn((x, y))  # plain arithmetic: the function runs on NumPy arrays as well
        levels = np.logspace(-3, np.log10(z.max()), 18)
        ax.contour(x, y, z, levels=levels, norm=LogNorm(), cmap="Greys_r", linewidths=0.6, alpha=0.6)
        for (label, path), color, width in zip(paths[name].items(), COLORS, WIDTHS):
            ax.plot(path[:, 0], path[:, 1], color=color, lw=width, label=label)
            ax.plot(path[marked, 0], path[marked, 1], "o", color=color, mec="white", mew=0.8, ms=6, zorder=4)
        ax.plot(*problem.start, "o", color="black", mfc="white", ms=8, mew=1.5, label="start", zorder=5)
        ax.plot(*problem.minimum, "*", color="black", ms=13, label="minimum", zorder=5)
        ax.set_title(problem.title, fontsize=10)
        ax.set(xlim=problem.xlim, ylim=problem.ylim, xlabel="x", ylabel="y")
    fig.suptitle(f"{steps} steps of each optimizer; dots after {' and '.join(map(str, marked))} steps; "
                 "contours log-spaced")
    # The same lines on both panels: one legend, under them.
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=4, frameon=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps instead of {STEPS}")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="where to write the PNG")
    args = parser.parse_args(argv)
    steps = QUICK_STEPS if args.quick else STEPS

    began = time.perf_counter()
    for name, opt in OPTIMIZERS.items():
        print(f"{name:<13} {opt}")
    print(f"\n{'function':<11} {'optimizer':<13} {'lr':>7} {'start f':>9} {'final f':>10} {'distance':>10}")
    paths = {}
    for name, problem in PROBLEMS.items():
        paths[name] = {}
        for opt_name, opt in OPTIMIZERS.items():
            path = np.asarray(trajectory(opt, problem.fn, jnp.array(problem.start), steps))
            learning_rate = opt.stages[-1].option("learning_rate")
            paths[name][f"{opt_name}, lr={learning_rate:g}"] = path
            distance = np.linalg.norm(path[-1] - np.array(problem.minimum))
            print(f"{name:<11} {opt_name:<13} {learning_rate:>7g} {float(problem.fn(path[0])):>9.7g} "
                  f"{float(problem.fn(path[-1])):>10.3e} {distance:>10.3e}")
    plot(paths, steps, args.out)
    print(f"\nwrote {args.out} ({args.out.stat().st_size / 1024:.0f} KB) in {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
