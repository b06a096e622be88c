"""The probe runs GradTopK's recursion once per cell: the forward pass's run gives the trace too.

Inside :func:`shared_trace` the trace of the recursion the forward pass ran is handed to the next
:func:`grad_recursive_trace` on the same bytes and ``k`` (never to another input), and the
probe's detection records are those of tracing every cell afresh.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import fields

import numpy as np
import pytest
from conftest import assert_same_bits

import topk_cli.operators.grad_recursive as gr
from topk_cli.analysis import probe
from topk_cli.analysis.probe import stability_probe
from topk_cli.api import evaluate, scaled_scores
from topk_cli.operators.grad_recursive import RecursionTrace, grad_recursive_trace, shared_trace


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the runs of the recursion."""
    count = [0]
    run = gr._run_recursion

    def counted(z: np.ndarray, k: int) -> gr._Recursion:
        count[0] += 1
        return run(z, k)

    monkeypatch.setattr(gr, "_run_recursion", counted)
    return count


def _same(a: RecursionTrace, b: RecursionTrace) -> None:
    for f in fields(RecursionTrace):
        assert_same_bits(getattr(a, f.name), getattr(b, f.name), f.name)


def _x() -> np.ndarray:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, 12)) * np.array([0.1, 1.0, 10.0, 40.0, 100.0, 1e3])[:, None]
    x[0, 3] = -np.inf  # a masked entry
    return x


def test_the_trace_of_the_forward_run_is_handed_over(runs: list[int]) -> None:
    x = _x()
    z = scaled_scores(x, 1)
    fresh = grad_recursive_trace(z, 5)
    runs[0] = 0
    with shared_trace():
        evaluate(x, 5, "grad-recursive")
        got = grad_recursive_trace(z.copy(), 5)  # equal bytes, another array
    assert runs[0] == 1
    _same(got, fresh)
    assert (got.kind != "ok").any() and (got.kind == "ok").any()  # both outcomes are covered


@pytest.mark.parametrize("other", ["scores", "k", "shape", "negative zero"])
def test_another_input_is_traced_afresh(runs: list[int], other: str) -> None:
    x = _x()
    z = scaled_scores(x, 1)
    k = 5
    if other == "scores":
        z2 = z.copy()
        z2[2, 7] = np.nextafter(z2[2, 7], -np.inf)  # one ulp away
    elif other == "k":
        z2, k = z, 4
    elif other == "shape":
        z2 = z.reshape(12, 6)
    else:
        z2 = z.copy()
        z2[z2 == 0.0] = -0.0  # equal values, other bytes: traced afresh, never assumed equal
    with shared_trace():
        evaluate(x, 5, "grad-recursive")
        got = grad_recursive_trace(z2, k)
    assert runs[0] == 2
    _same(got, grad_recursive_trace(z2, k))


def test_the_trace_is_handed_out_once_and_only_inside_the_block(runs: list[int]) -> None:
    x = _x()
    z = scaled_scores(x, 1)
    evaluate(x, 3, "grad-recursive")
    grad_recursive_trace(z, 3)
    assert runs[0] == 2  # no memo outside the block
    with shared_trace():
        evaluate(x, 3, "grad-recursive")
        grad_recursive_trace(z, 3)
        grad_recursive_trace(z, 3)
    assert runs[0] == 4  # the second trace ran the recursion again
    grad_recursive_trace(z, 3)
    assert runs[0] == 5


@contextlib.contextmanager
def _no_sharing() -> Iterator[None]:
    yield


def test_probe_runs_the_recursion_once_per_cell_with_the_same_records(
    runs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = {"methods": ["grad-recursive"], "ns": [10, 100], "ks": [1, 2, 5, 10, 50], "trials": 5}
    shared = stability_probe(**grid)  # type: ignore[arg-type]
    assert runs[0] == len(shared.cells)
    monkeypatch.setattr(probe, "shared_trace", _no_sharing)  # every cell traced afresh, as before
    fresh = stability_probe(**grid)  # type: ignore[arg-type]
    assert runs[0] == 2 * len(shared.cells) + len(shared.cells)
    assert repr(shared) == repr(fresh)
    assert any(c.detection is not None and c.detection.broken for c in shared.cells)
