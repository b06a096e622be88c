"""grad-recursive's tie averaging: only the rows whose complement comes from ``grad``'s program.

On a row the running bound certifies, ``p_i`` and ``q_i = fl(1 - p_i)`` depend on ``z_i`` and row
scalars only, so tied entries already have equal bits and the API leaves the row as computed;
on a row checked against ``grad``, ``q`` is ``grad``'s, whose tied entries can differ in the last
bits, and the API averages them as before.
"""

from __future__ import annotations

import numpy as np
import pytest

import topk_cli
import topk_cli.api as api
from topk_cli.operators._base import average_ties
from topk_cli.operators.grad_recursive import _recursive_forward

K = 4
#: Row 0: checked against grad (not certified), grad's complements of its three tied 0.0 differ
#: in the last bit. Row 1: certified; averaging its tied triples would move them by an ulp.
X = np.array([
    [2.0, 0.0, -1.0, 0.0, 1.0, 0.0, -1.0, -1.0],
    [-1.0, -1.0, -0.0, -1.0, 0.5, 0.5, 0.5, -0.5],
])


def _ties_equal(z: np.ndarray, a: np.ndarray) -> bool:
    return all(len({float(v) for v in a[z == value]}) == 1 for value in np.unique(z))


def test_certified_rows_skip_tie_averaging_and_checked_rows_are_averaged(monkeypatch: pytest.MonkeyPatch) -> None:
    z = topk_cli.scaled_scores(X, K)
    raw = _recursive_forward(z, K)
    assert raw.codes().tolist() == ["ok", "ok"]
    assert raw.elementwise_rows is not None and raw.elementwise_rows.tolist() == [False, True]
    # the premises that make this test able to fail
    assert not _ties_equal(z[0], raw.q[0])  # grad's complements of tied entries differ
    p_avg, q_avg = average_ties(z, raw.p, raw.q)
    assert not (p_avg[1] == raw.p[1]).all() and not (q_avg[1] == raw.q[1]).all()

    seen: list[object] = []

    def spy(z_: np.ndarray, *arrays: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        seen.append(None if rows is None else rows.tolist())
        return average_ties(z_, *arrays, rows=rows)

    monkeypatch.setattr(api, "average_ties", spy)
    r = topk_cli.evaluate(X, K, "grad-recursive")
    assert seen == [[0]]
    for row in range(2):
        assert _ties_equal(z[row], r.weights[row]) and _ties_equal(z[row], r.complement[row])
    # the certified row is the recursion's own output, bit for bit
    np.testing.assert_array_equal(r.weights[1], raw.p[1])
    np.testing.assert_array_equal(r.complement[1], raw.q[1])
    # the checked row is averaged exactly as every row used to be
    np.testing.assert_array_equal(r.weights[0], p_avg[0])
    np.testing.assert_array_equal(r.complement[0], q_avg[0])


def test_average_ties_on_a_subset_of_rows_leaves_the_others() -> None:
    z = np.array([[0.0, 0.0, 1.0], [2.0, 2.0, 2.0], [0.0, 1.0, 2.0]])
    a = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.9], [0.7, 0.8, 0.6]])
    (everything,) = average_ties(z, a)
    (first,) = average_ties(z, a, rows=np.array([0]))
    np.testing.assert_array_equal(first[0], everything[0])
    np.testing.assert_array_equal(first[1:], a[1:])
    assert average_ties(z, a, rows=np.array([2]))[0] is a  # no tie in that row: unchanged
    assert average_ties(z, a, rows=np.array([], dtype=np.int64))[0] is a
    np.testing.assert_array_equal(average_ties(z, a, rows=np.array([1, 0, 2]))[0], everything)


def test_combined_forwards_keep_the_elementwise_rows_of_each_part() -> None:
    from topk_cli.operators._base import Forward, _combine_rows

    def part(rows: int, mask: list[bool] | None) -> Forward:
        fwd = Forward(p=np.zeros((rows, 2)), q=np.ones((rows, 2)))
        fwd.elementwise_rows = None if mask is None else np.array(mask)
        return fwd

    out = _combine_rows(4, [(np.array([0, 1, 2]), part(3, [True, False, True])), (np.array([2, 3]), part(2, None))])
    assert out.elementwise_rows is not None and out.elementwise_rows.tolist() == [True, False, False, False]
    assert _combine_rows(2, [(np.array([0, 1]), part(2, None))]).elementwise_rows is None
