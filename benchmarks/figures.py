"""The performance page's three figures, drawn from the recorded results: step time, compile time and memory,
updax against optax, per workload and recipe.

Run from the repository root (``pip install -e ".[bench]"`` first); it measures nothing, so it takes seconds::

    python benchmarks/figures.py                  # docs/performance-{step,compile,memory}.png
    python benchmarks/figures.py --out /tmp/figs  # the same pictures elsewhere

Each case takes its numbers from the latest recorded run that measured it. The runs are listed below, oldest
first, with their dates and code (the result files do not record them); a new run is one more line. A bar from a
run older than the figure's latest is hatched and the legend names its run. Bars are coloured by the benchmarks'
verdict: below or above optax when the round ratios' quartiles are beyond 1 and beyond updax's scatter against
itself (``compile_times.verdict``), level otherwise. The memory figure compares the step's peak (params,
gradients, state and XLA's temporaries), which ``compiled.memory_analysis()`` gives exactly: no verdict needed.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.patches import Patch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

#: The recorded runs each figure reads, oldest first: (file in benchmarks/results/, what the run was).
STEP_RUNS = [
    ("step_times.json", "2026-11-27, code 5623c89, 7 rounds"),
    ("rewrite_39.md", "2026-11-27, code 9ef6206, 3 rounds"),
]
COMPILE_RUNS = [
    ("compile_times_S.json", "2026-11-26, 3 rounds"),
    ("compile_times.json", "2026-11-27, code 5623c89, 7 rounds"),
    ("rewrite_39.md", "2026-11-27, code 9ef6206, 3 rounds"),
]
MEMORY_RUNS = [
    ("results.json", "2026-11-25 (exact; T, B and 5 S cases checked the same at 8a3e867)"),
]

RECIPES = ["adam", "adamw", "clip+adamw", "lamb", "sgd+momentum", "lion", "adafactor", "adam/flat",
           "clip+adamw/flat", "sgd+momentum/flat"]
#: The workloads (benchmarks/run.py): a short name for the panel, and what each is.
WORKLOADS = {
    "T": ("transformer-like", ("the optimizer step on 48 blocks of 4 attention matrices 256x256, 2 MLP matrices"
                               " 256x1024, a layer norm")),
    "S": ("many small", "the optimizer step on 1000 leaves of 1k-7k floats, 1000 distinct shapes"),
    "B": ("big leaves", "the optimizer step on 4 leaves of 4M floats"),
    "train": ("whole step", ("loss, gradients and optimizer step of a 4-block transformer (d=256, 256 tokens),"
                             " one jit")),
}
COLOURS = {"below": "#0072B2", "level": "#9E9E9E", "above": "#D55E00"}
WORDS = {
    "time": {"below": "faster than optax", "level": "level (within updax's own scatter)", "above": "slower than optax"},
    "memory": {"below": "less than optax", "level": "the same", "above": "more than optax"},
}


def _case(workload, recipe, median, q1=None, q3=None, verdict=None):
    return {"workload": workload, "recipe": recipe, "ratio": median, "q1": q1, "q3": q3, "verdict": verdict}


def _rounds_json(path):
    """The cases of a step_times.py or compile_times.py run: median and quartiles of the round ratios, verdict."""
    rows = json.loads(path.read_text())["rows"]
    return [_case(r["workload"], r["recipe"], r["ratio_quartiles"][1], r["ratio_quartiles"][0],
                  r["ratio_quartiles"][2], r["verdict"]) for r in rows]


def _after_columns(path, section):
    """The "after" side of a before/after table (benchmarks/results/rewrite_39.md): its ``### section`` rows
    ``| T adam | before ... | verdict | after: ms | ratio [q1, q3] | A/A [q1, q3] | verdict | after/before |``."""
    text = path.read_text().split(f"### {section}\n", 1)[1].split("\n### ", 1)[0]
    cases = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 10 or cells[0] in ("case", "---"):
            continue
        workload, recipe = cells[0].split(" ", 1)
        median, q1, q3 = map(float, re.fullmatch(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", cells[6]).groups())
        cases.append(_case(workload, recipe, median, q1, q3, cells[8]))
    return cases


def _peak_memory(path):
    """The cases of benchmarks/run.py's run: the step's peak memory, updax / optax, exact (no rounds needed)."""
    cases = []
    for r in json.loads(path.read_text())["rows"]:
        if "updax_peak_mb" in r:  # (the train step's memory is not measured)
            ratio = r["updax_peak_mb"] / r["optax_peak_mb"]
            verdict = "below" if ratio < 0.999 else "above" if ratio > 1.001 else "level"
            cases.append({**_case(r["workload"], r["recipe"], ratio, verdict=verdict),
                          "label": f"{r['updax_peak_mb']:.0f} / {r['optax_peak_mb']:.0f} MB"})
    return cases


def read(results, runs, measure):
    """{(workload, recipe): case} from the latest run of ``runs`` that has the case; each case names its run."""
    cases = {}
    for index, (name, _) in enumerate(runs):
        path = Path(results) / name
        if measure == "memory":
            found = _peak_memory(path)
        elif name.endswith(".md"):
            found = _after_columns(path, f"{measure}_times")
        else:
            found = _rounds_json(path)
        cases.update({(c["workload"], c["recipe"]): {**c, "run": index} for c in found})
    return cases


def workload_sizes(results):
    """{workload: (params, leaves)}, as recorded by benchmarks/run.py."""
    rows = json.loads((Path(results) / "results.json").read_text())["rows"]
    return {r["workload"]: (r["params"], r["leaves"]) for r in rows}


def _label(recipe):
    name, _, flat = recipe.partition("/")
    return name.replace("momentum", "mom.") + (" flat" if flat else "")


def draw(cases, runs, workloads, sizes, title, xlabel, words, path, labels=False):
    """One panel per workload, one bar per recipe: updax / optax, with the quartiles of the round ratios; under
    them the axis label, the legend and what each workload is. 800 pixels wide."""
    latest = max(c["run"] for c in cases.values())
    verdicts = {c["verdict"] for c in cases.values()}
    handles = [Patch(color=COLOURS[v], label=words[v]) for v in ("below", "level", "above") if v in verdicts]
    if not labels:
        handles.append(plt.Line2D([], [], color="black", lw=1.5, label="quartiles of the rounds"))
    handles += [Patch(facecolor="#D9D9D9", edgecolor="white", hatch="///", label=f"hatched: older run, {runs[i][1]}")
                for i in sorted({c["run"] for c in cases.values()} - {latest})]
    # Heights in inches, from the bottom: the workloads' lines, the legend's rows, the axis label, the panels,
    # the panels' titles and the figure's.
    line = 0.19
    footer, legend = line * len(workloads) + 0.1, line * 1.15 * -(-len(handles) // 2) + 0.1
    below, panels, above = footer + legend + 0.75, 3.3, 1.45
    height = below + panels + above
    fig, axes = plt.subplots(1, len(workloads), sharey=True, figsize=(8, height), dpi=100)
    rows = list(range(len(RECIPES)))[::-1]
    right = max(c["q3"] or c["ratio"] for c in cases.values())
    for ax, workload in zip(axes, workloads):
        for y, recipe in zip(rows, RECIPES):
            case = cases.get((workload, recipe))
            if case is None:
                ax.text(0.04, y, "not in rounds", va="center", fontsize=9, color="#666666")
                continue
            ax.barh(y, case["ratio"], height=0.72, color=COLOURS[case["verdict"]], edgecolor="white",
                    hatch="///" if case["run"] != latest else None)
            if case["q1"] is not None:
                ax.plot([case["q1"], case["q3"]], [y, y], color="black", lw=1.5)
            text = case["label"] if labels else f"{case['ratio']:.2f}"
            ax.text(1.06 * right, y, text, va="center", fontsize=9)  # (a column right of every bar and whisker)
        ax.axvline(1.0, color="black", lw=1)
        ax.set_xlim(0, right * (1.75 if labels else 1.42))
        ax.set_xticks([0, 0.5, 1.0])
        ax.tick_params(labelsize=10)
        params, leaves = sizes[workload]
        ax.set_title(f"{workload}: {WORKLOADS[workload][0]}\n{params / 1e6:.1f}M params\n{leaves} leaves",
                     fontsize=10.5)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_yticks(rows, [_label(r) for r in RECIPES], fontsize=10.5)
    fig.suptitle(f"{title}\nrun of {runs[latest][1]}", fontsize=12.5, y=1 - 0.1 / height)
    fig.text(0.5, (footer + legend + 0.1) / height, xlabel, ha="center", va="bottom", fontsize=11)
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, footer / height), ncol=2, fontsize=9.5,
               frameon=False, handlelength=1.6, borderaxespad=0.2, columnspacing=1.5)
    fig.text(0.01, 0.05 / height, "\n".join(f"{w}: {WORKLOADS[w][1]}" for w in workloads), fontsize=9,
             va="bottom", linespacing=1.35)
    fig.subplots_adjust(left=0.17, right=0.985, top=1 - above / height, bottom=below / height, wspace=0.1)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results"), help="the recorded results")
    parser.add_argument("--out", default=str(ROOT / "docs"), help="where the PNGs go")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = workload_sizes(args.results)
    paths = [out / f"performance-{name}.png" for name in ("step", "compile", "memory")]
    draw(read(args.results, STEP_RUNS, "step"), STEP_RUNS, ["T", "S", "B", "train"], sizes,
         "Step time, updax / optax: lower is faster", "updax's step time / optax's (1 = the same)",
         WORDS["time"], paths[0])
    draw(read(args.results, COMPILE_RUNS, "compile"), COMPILE_RUNS, ["T", "S", "B"], sizes,
         "Compile time, updax / optax: lower is faster", "updax's compile time / optax's (1 = the same)",
         WORDS["time"], paths[1])
    draw(read(args.results, MEMORY_RUNS, "memory"), MEMORY_RUNS, ["T", "S", "B"], sizes,
         "Peak memory of a step, updax / optax: lower is smaller",
         "updax's peak / optax's (params, grads, state and temporaries; the state is the same)",
         WORDS["memory"], paths[2], labels=True)
    return paths


if __name__ == "__main__":
    main()
