"""Every Python block of the README and the docs runs, the examples run, and the docs cover every export."""

from __future__ import annotations

import ast
import contextlib
import datetime
import doctest
import inspect
import io
import json
import pathlib
import re
import statistics
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux
from compile_options import default_compile_env
from registry import catalogue_names

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```\s*$", re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_python_block_of_a_page_runs(page):
    """Blocks run in order in one namespace; blocks with ``>>>`` are doctests, the others scripts."""
    text = page.read_text()
    blocks = FENCE.findall(text)
    namespace = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        name = f"{page.name} block {i}"
        if ">>>" in code:
            test = doctest.DocTestParser().get_doctest(code, namespace, name, str(page), 0)
            runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
            out = io.StringIO()
            runner.run(test, out=out.write, clear_globs=False)
            assert runner.failures == 0, out.getvalue()
            namespace.update(test.globs)
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, name, "exec"), namespace)


def _catalogue_rows(text):
    """{name: options cell} for each table row whose first cell is one backticked name."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and re.fullmatch(r"`\w+`", cells[0]):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def _documented_signature(cell):
    """{option: default or EMPTY} from the backticked option lists of a catalogue cell."""
    options = {}
    for chunk in re.findall(r"`([^`]*)`", cell):
        try:
            args = ast.parse(f"def f({chunk}): pass").body[0].args
        except SyntaxError:
            continue  # prose such as `count -> step size`
        positional = args.posonlyargs + args.args
        defaults = [None] * (len(positional) - len(args.defaults)) + args.defaults + args.kw_defaults
        for arg, default in zip(positional + args.kwonlyargs, defaults):  # None: no default
            options[arg.arg] = inspect.Parameter.empty if default is None else ast.literal_eval(default)
    return options


def test_every_catalogue_entry_and_optimizer_is_documented():
    """Each exported combinator has a catalogue row with its signature, each optimizer a section with its pipeline."""
    catalogue = (ROOT / "docs" / "catalogue.md").read_text()
    rows = _catalogue_rows(catalogue)
    missing = [name for name in catalogue_names() if name not in rows]
    assert not missing, f"docs/catalogue.md has no row for {missing}"
    for name in catalogue_names():
        documented = _documented_signature(rows[name])
        actual = {p.name: p.default for p in inspect.signature(getattr(ux.updates, name)).parameters.values()
                  if p.name != "inner"}  # a wrapper's parent pipeline is not an option
        assert documented == actual, f"docs/catalogue.md, row {name}: {documented} != the signature's {actual}"

    optimizers = (ROOT / "docs" / "optimizers.md").read_text()
    for name in ux.optimizers.__all__:
        assert re.search(rf"^#+ `?{name}`?$", optimizers, re.M), f"docs/optimizers.md has no section for {name}"
        assert f"print(ux.optimizers.{name}(" in optimizers, f"docs/optimizers.md does not print {name}'s pipeline"


def _run(script):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart_trains_the_digits_mlp():
    out = _run("quickstart.py")
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", out).group(1))
    assert accuracy >= 0.95, out


def test_custom_combinator_example_runs():
    assert "|>" in _run("custom_combinator.py")


def test_averaging_and_accumulation_example_skips_the_corrupted_batches():
    out = _run("averaging_and_accumulation.py")
    calls, skipped, steps = map(int, re.search(r"(\d+) micro-batches, (\d+) skipped as non-finite, (\d+) optimizer",
                                               out).groups())
    assert skipped == calls // 25 and steps == (calls - skipped) // 4, out
    for accuracy in re.findall(r"test accuracy.*: ([0-9.]+)", out):
        assert float(accuracy) >= 0.95, out


def test_the_benchmark_runs_and_agrees_with_optax(tmp_path):
    """A smoke run of benchmarks/run.py on its smallest case: it writes its reports and matches optax."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    result = bench.main(["--quick", "--workloads", "B", "--recipes", "adam,clip+adamw,lamb", "--repeats", "1",
                         "--out", str(tmp_path)])
    assert [r["recipe"] for r in result["rows"]] == ["adam", "clip+adamw", "lamb"]
    for row in result["rows"]:
        assert row["max_rel_diff"] < 1e-3, row
        # Adam's state is its two float32 moments and a step count, nothing more.
        assert abs(row["updax_state_mb"] - 2 * 4 * row["params"] / 2**20) < 1e-3, row
        # Donated params and state are updated in place: the step holds params, both moments and the
        # gradients (four float32 buffers) and its temporaries, and not one more params-sized buffer.
        buffers_mb, one_more_mb = 4 * 4 * row["params"] / 2**20, 4 * row["params"] / 2**20
        assert buffers_mb <= row["updax_peak_mb"] < buffers_mb + row["updax_temp_mb"] + one_more_mb, row
        assert row["bandwidth_gb_s"] > 0, row
    assert (tmp_path / "results-quick.json").exists()
    assert "| B | adam |" in (tmp_path / "results-quick.md").read_text()


def test_an_accelerator_run_is_written_apart_from_the_cpu_run(tmp_path):
    """The benchmarks' results on a GPU (or any device but the CPU) go to files of their own, named after the
    platform, so a GPU run never overwrites or mixes with the recorded CPU numbers; quick runs likewise."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    runs = [("cpu", False, "cpu table"), ("gpu", False, "gpu table"), ("gpu", True, "quick gpu table"),
            ("tpu", False, "tpu table")]
    for platform, quick, text in runs:
        bench.write_results(tmp_path, "step_times", {"platform": platform, "quick": quick}, text)
    written = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert {name: text for name, text in written.items() if name.endswith(".md")} == {
        "step_times.md": "cpu table", "step_times-gpu.md": "gpu table", "step_times-gpu-quick.md": "quick gpu table",
        "step_times-tpu.md": "tpu table"}
    assert json.loads(written["step_times-gpu.json"]) == {"platform": "gpu", "quick": False}
    assert bench.environment()["platform"] == jax.devices()[0].platform


def test_a_result_records_when_and_at_which_commit_it_was_measured():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    env = bench.environment()
    measured = datetime.datetime.fromisoformat(env["date"])
    assert measured.tzinfo is not None and abs(datetime.datetime.now(datetime.timezone.utc) - measured).seconds < 60
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:  # (a checkout: CI's clean clone is one)
        assert head.stdout.startswith(env["commit"].removesuffix("+dirty"))


def test_the_device_check_runs_and_compares_with_the_cpu_and_optax(tmp_path):
    """A smoke run of benchmarks/gpu_check.py (the device check's first part) on this machine's device: the step
    compiled for it and for the CPU, and optax's, agree within the check's bounds; it exits 1 on a failure. It
    runs as a user runs it, at XLA's default compilation (tests/compile_options.py)."""
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--quick", "--optimizers",
                          "adam,lion", "--out", str(tmp_path)], capture_output=True, text=True,
                         env=default_compile_env(), timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {row["optimizer"]: row for row in json.loads((tmp_path / "gpu_check-quick.json").read_text())["rows"]}
    assert sorted(rows) == ["adam", "lion"] and all(row["ok"] for row in rows.values()), rows
    assert rows["adam"]["vs_optax"] > 0  # (a real comparison: optax's Adam rounds apart)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    with pytest.raises(SystemExit):
        gpu_check.main(["--optimizers", "adam+momentum"])


def test_the_in_place_benchmark_runs_and_finds_the_copies_gone(tmp_path):
    """A smoke run of benchmarks/in_place.py on Lion: the ordered step copies nothing and needs no temporary where
    the unordered one and optax's copy the momentum, with the same numbers bit for bit."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import in_place as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert "lion" in bench.declaring()
    (row,) = bench.main(["--quick", "--optimizers", "lion", "--repeats", "1", "--out", str(tmp_path)])["rows"]
    assert row["updax_copies"] == 0 < row["unordered_copies"] == row["optax_copies"], row
    assert row["updax_temp_mb"] < 0.01 < row["unordered_temp_mb"], row
    assert row["same_numbers"], row
    assert "| lion |" in (tmp_path / "in_place-quick.md").read_text()


def test_the_lookahead_benchmark_runs_and_finds_the_copies_gone(tmp_path):
    """A smoke run of benchmarks/lookahead.py: updax's step copies nothing where its former formula and optax's
    copy the params and the slow weights."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import lookahead as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rows = {row["side"]: row for row in bench.main(["--quick", "--rounds", "1", "--repeats", "1",
                                                    "--out", str(tmp_path)])["rows"]}
    assert rows["updax"]["copies"] == 0 < rows["former"]["copies"] == rows["optax"]["copies"], rows
    assert rows["updax"]["temp_mb"] < 0.01 < rows["former"]["temp_mb"], rows
    assert "| updax |" in (tmp_path / "lookahead-quick.md").read_text()


def test_the_compile_time_benchmark_runs_and_judges_against_its_own_noise(tmp_path):
    """A smoke run of benchmarks/compile_times.py, and its verdict on made-up rounds: a gap counts only beyond
    the quartiles of updax against itself."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import compile_times as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert bench.verdict([1.2, 1.3, 1.25, 1.4], [0.95, 1.0, 1.05, 1.02]) == "above"
    assert bench.verdict([0.7, 0.8, 0.75, 0.9], [0.95, 1.0, 1.05, 1.02]) == "below"
    assert bench.verdict([1.1, 1.15, 1.2, 1.12], [0.8, 1.0, 1.3, 1.25]) == "level"  # within updax's own spread
    assert bench.verdict([0.7, 1.3, 0.9, 1.2], [1.0, 1.0, 1.0, 1.0]) == "level"  # a quartile on each side of 1
    for bad in (["--rounds", "0"], ["--workloads", "X"], ["--recipes", "adam,nadam"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main([*bad, "--out", str(tmp_path)])
        assert exit_info.value.code == 2, bad
    (row,) = bench.main(["--quick", "--workloads", "B", "--recipes", "sgd+momentum", "--rounds", "2",
                         "--out", str(tmp_path)])["rows"]
    assert len(row["updax_compiles_s"]) == len(row["optax_compiles_s"]) == len(row["updax_again_s"]) == 2, row
    assert row["ratio_quartiles"][1] == pytest.approx(
        statistics.median(u / o for u, o in zip(row["updax_compiles_s"], row["optax_compiles_s"]))), row
    assert row["verdict"] in ("below", "level", "above"), row
    assert "| B | sgd+momentum |" in (tmp_path / "compile_times-quick.md").read_text()


def test_the_catalogue_benchmark_pairs_every_optimizer_with_optax_s_same_rule(tmp_path):
    """benchmarks/catalogue.py: every optimizer is paired or left out with a reason, each pair computes the same
    numbers (but rprop, one step late in optax 0.2.8), and ``compile_times.py --catalogue`` runs on it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import catalogue
        import compile_times as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert set(catalogue.CATALOGUE) | set(catalogue.LEFT_OUT) == set(ux.optimizers.__all__)
    assert not set(catalogue.CATALOGUE) & set(catalogue.LEFT_OUT) and catalogue.LAGGED <= set(catalogue.CATALOGUE)
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(6, 5)), jnp.float32), "b": jnp.asarray(rng.uniform(0.5, 1, 5),
                                                                                        jnp.float32)}
    assert not set(catalogue.CATALOGUE) & set(catalogue.OPTIONS)
    for name in catalogue.ALL:
        worst = catalogue.same_numbers(name, params)
        assert (worst > 0.1) if name in catalogue.LAGGED else (worst < 1e-3), (name, worst)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--catalogue", "--recipes", "adam+momentum", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    (row,) = bench.main(["--catalogue", "--quick", "--recipes", "adopt", "--rounds", "1", "--out", str(tmp_path)])[
        "rows"]
    assert (row["workload"], row["recipe"], row["rounds"]) == ("T", "adopt", 1), row
    # ADOPT writes its state in place (tests/test_in_place.py); optax's step copies it, one copy per leaf.
    leaves = len(jax.tree.leaves(bench.run.workloads(True)["T"]))
    assert row["updax_kernels"]["copies"] == 0 and row["optax_kernels"]["copies"] == leaves, row
    assert row["updax_kernels"]["fusions"] >= leaves, row
    assert "| T | adopt |" in (tmp_path / "compile_times_catalogue-quick.md").read_text()


def test_the_step_time_benchmark_runs_in_rounds_and_judges_with_the_compile_time_rule(tmp_path):
    """A smoke run of benchmarks/step_times.py: per-round ratios, the A/A beside them, and the verdict rule
    shared with compile_times.py."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import compile_times
        import step_times as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert bench.verdict is compile_times.verdict
    for bad in (["--rounds", "0"], ["--repeats", "0"], ["--workloads", "X"], ["--recipes", "adam,nadam"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main([*bad, "--out", str(tmp_path)])
        assert exit_info.value.code == 2, bad
    rows = bench.main(["--quick", "--workloads", "B,train", "--recipes", "sgd+momentum", "--rounds", "2",
                       "--repeats", "2", "--out", str(tmp_path)])["rows"]
    assert [(r["workload"], r["recipe"]) for r in rows] == [("B", "sgd+momentum"), ("train", "sgd+momentum")]
    for row in rows:
        assert len(row["updax_round_ms"]) == len(row["optax_round_ms"]) == len(row["updax_again_round_ms"]) == 2
        ratios = [u / o for u, o in zip(row["updax_round_ms"], row["optax_round_ms"])]
        aa = [u / again for u, again in zip(row["updax_round_ms"], row["updax_again_round_ms"])]
        assert row["ratio_quartiles"][1] == pytest.approx(statistics.median(ratios)), row
        assert row["aa_quartiles"][1] == pytest.approx(statistics.median(aa)), row
        assert row["updax_ms"] == pytest.approx(statistics.median(row["updax_round_ms"])), row
        assert row["verdict"] == bench.verdict(ratios, aa), row
    text = (tmp_path / "step_times-quick.md").read_text()
    assert "| train | sgd+momentum |" in text and "of 2." in text
    # --catalogue: the pairs of catalogue.py, on T by default; train (run.py's own problem) is refused with it.
    for bad in (["--workloads", "train"], ["--recipes", "adam+momentum"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(["--catalogue", *bad, "--out", str(tmp_path)])
        assert exit_info.value.code == 2, bad
    (row,) = bench.main(["--catalogue", "--quick", "--recipes", "dowg", "--rounds", "1", "--repeats", "1",
                         "--out", str(tmp_path)])["rows"]
    assert (row["workload"], row["recipe"], len(row["optax_round_ms"])) == ("T", "dowg", 1), row
    assert "| T | dowg |" in (tmp_path / "step_times_catalogue-quick.md").read_text()


def test_the_figures_are_drawn_from_the_recorded_results(tmp_path):
    """benchmarks/figures.py draws the performance page's three pictures from benchmarks/results/ (measuring
    nothing), 800 pixels wide, each case from the latest run that has it; the committed pictures are its output."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import figures
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    paths = figures.main(["--out", str(tmp_path)])
    assert [p.name for p in paths] == ["performance-step.png", "performance-compile.png", "performance-memory.png"]
    page = (ROOT / "docs" / "performance.md").read_text()
    for path in paths:
        width = int.from_bytes(path.read_bytes()[16:20], "big")  # (the PNG header's width)
        assert width == 800, (path.name, width)
        assert (ROOT / "docs" / path.name).exists() and f"({path.name})" in page, path.name
    results = ROOT / "benchmarks" / "results"
    step = figures.read(results, figures.STEP_RUNS, "step")
    assert len(step) == 40 and step[("T", "lamb")]["run"] == len(figures.STEP_RUNS) - 1  # (the latest run has it)
    assert step[("S", "adam")]["run"] < step[("S", "adam/flat")]["run"]  # (S's default layout: an older run)
    memory = figures.read(results, figures.MEMORY_RUNS, "memory")
    assert memory[("T", "lamb")]["label"] == "577 / 865 MB" and memory[("T", "adam")]["verdict"] == "level"


#: Polaris 0.1's public API (https://hexdocs.pm/polaris/0.1.0/), arities folded: what the porting checklist covers.
POLARIS = {
    "Polaris.Updates": ["add_decayed_weights", "add_noise", "apply_updates", "centralize", "clip",
                        "clip_by_global_norm", "compose", "identity", "scale", "scale_by_adam", "scale_by_belief",
                        "scale_by_radam", "scale_by_rms", "scale_by_rss", "scale_by_schedule", "scale_by_state",
                        "scale_by_stddev", "scale_by_trust_ratio", "scale_by_yogi", "stateful", "stateless", "trace"],
    "Polaris.Optimizers": ["adabelief", "adagrad", "adam", "adamw", "fromage", "lamb", "noisy_sgd", "radam",
                           "rmsprop", "sgd", "yogi"],
    "Polaris.Schedules": ["constant", "cosine_decay", "exponential_decay", "polynomial_decay", "linear_decay"],
}


def test_the_porting_checklist_covers_polaris_and_names_what_exists():
    text = (ROOT / "docs" / "porting.md").read_text()
    rows = re.findall(r"^\| `(Polaris\.\w+)\.(\w+)/[\d,]+` \| `([\w.]+)\(", text, re.M)
    rows += re.findall(r"^\| `(Polaris\.(?:Optimizers|Schedules))\.(\w+)` \| `([\w.]+)\(", text, re.M)
    found = {}
    for module, name, python in rows:
        found.setdefault(module, []).append(name)
        head, *path = python.split(".")
        obj = {"ux": ux, "uxs": ux.schedules}[head]
        for part in path:
            obj = getattr(obj, part)
        assert callable(obj) and path[-1] == name, (module, name, python)
    assert {m: sorted(n) for m, n in found.items()} == {m: sorted(n) for m, n in POLARIS.items()}


def test_the_readmes_links_name_files_of_the_repository():
    """The README is read on a code host, outside the site: each relative link must name a file or folder here."""
    links = re.findall(r"\]\(((?!https?:)[^)#]+)", (ROOT / "README.md").read_text())
    assert len(links) >= 10
    assert not [link for link in links if not (ROOT / link).exists()]


def test_the_tiny_language_model_example_trains_in_its_quick_mode(tmp_path):
    """examples/tiny_lm.py --quick: every optimizer this updax has takes a few steps; the table and picture exist."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import tiny_lm
    finally:
        sys.path.pop(0)
    results = tiny_lm.main(["--quick", "--out", str(tmp_path)])
    assert {"adamw", "cautious adamw", "muon"} <= set(results)
    for name, r in results.items():
        assert len(r["losses"]) == 4 and all(np.isfinite(r["losses"])), name
        assert r["losses"][-1] < r["losses"][0], name  # a few steps already lower the loss from ln(256) = 5.5
    n = sum(p.size for p in jax.tree.leaves(tiny_lm.init_params(jax.random.key(0))))
    assert results["adamw"]["state_bytes"] == 2 * 4 * n + 4  # Adam's two moments in float32, and its step counter
    table = (tmp_path / "tiny_lm.md").read_text()
    assert "| adamw |" in table and (tmp_path / "tiny_lm.png").stat().st_size > 10_000
