"""Two processes train data-parallel with jax.distributed on CPU and agree with one process (examples/distributed.py)."""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _example():
    spec = importlib.util.spec_from_file_location("distributed_example", ROOT / "examples" / "distributed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_processes_train_exactly_as_one(capsys):
    """2 processes x 2 CPU devices, each loading half of every global batch, against 1 process on 1 device."""
    example = _example()
    results = example.main([])  # the launcher: two workers and the reference in subprocesses, 300 s at most
    workers, reference = results["workers"], results["reference"]

    assert [w["process_id"] for w in workers] == [0, 1]
    assert all(w["devices"] == 4 and w["local_devices"] == 2 for w in workers)
    assert [w["rows"] for w in workers] == [[0, 32], [32, 64]]  # each process loaded only its half
    assert reference["devices"] == 1 and reference["rows"] == [0, 64]

    for w in workers:
        assert len(w["losses"]) == example.STEPS
        for name, value in reference["params"].items():
            # Both processes hold the same params, bit for bit: the gradient all-reduce gives each the same sum.
            np.testing.assert_array_equal(w["params"][name], workers[0]["params"][name])
            # One device sums the batch in another order: differences of about 1e-7 on params of order 1.
            np.testing.assert_allclose(w["params"][name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(w["losses"], reference["losses"], rtol=1e-5)

    # The first loss is the mean over the whole global batch at the initial params, computed here independently.
    opt = example.make_optimizer()
    params, _ = example.init_train_state(opt, jax.random.key(example.SEED))
    first = example.loss_fn(params, *example.load_rows(0, range(example.GLOBAL_BATCH)))
    np.testing.assert_allclose(workers[0]["losses"][0], float(first), rtol=1e-6)
    assert reference["losses"][-1] < 0.1 * reference["losses"][0]  # it trained: 0.85 -> 0.035
    assert min(np.max(np.abs(np.subtract(reference["params"][name], params[name]))) for name in params) > 1e-3

    out = capsys.readouterr().out
    assert results["agree"] and "params match the single-process run: True" in out, out
