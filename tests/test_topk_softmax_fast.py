"""topk-softmax's one-partition forward: tie rows (the (k-1)-th and k-th entries equal) mixed with
plain rows in one batch, the complement of a dominant soft entry, masked entries, k = n."""

from __future__ import annotations

import numpy as np

from topk_cli.operators.topk_softmax import topk_softmax_forward


def test_a_tie_at_the_boundary_still_gives_k_minus_1_hard_entries() -> None:
    z = np.array([[0.0, -1.0, -1.0, -1.0, -3.0],   # s_2 = s_3 = s_4: one of the three is hard
                  [0.0, -1.0, -2.0, -3.0, -4.0],
                  [-1.0, -1.0, 0.0, -np.inf, -2.0]])
    fwd = topk_softmax_forward(z, 3)
    np.testing.assert_array_equal((fwd.p == 1.0).sum(axis=1), [2, 2, 2])
    np.testing.assert_allclose(fwd.p.sum(axis=1), 3.0, rtol=0, atol=1e-15)
    # row 0: the two tied soft entries share the softmax with e^-2
    soft = np.sort(fwd.p[0])[:3]
    np.testing.assert_allclose(soft, [np.exp(-2) / (2 + np.exp(-2)), 1 / (2 + np.exp(-2)), 1 / (2 + np.exp(-2))],
                               rtol=1e-15)
    assert fwd.p[2, 3] == 0.0 and fwd.q[2, 3] == 1.0


def test_the_complement_of_a_dominant_soft_entry_keeps_its_digits() -> None:
    z = np.array([[0.0, -10.0, -50.0, -60.0]])
    fwd = topk_softmax_forward(z, 2)  # soft: -10, -50, -60; the top soft entry has q ~ e^-40
    want = (np.exp(-40.0) + np.exp(-50.0)) / (1 + np.exp(-40.0) + np.exp(-50.0))
    np.testing.assert_allclose(fwd.q[0, 1], want, rtol=4e-16)
    assert fwd.p[0, 0] == 1.0 and fwd.q[0, 0] == 0.0
    np.testing.assert_allclose(fwd.q[0, 2:], 1.0 - fwd.p[0, 2:], rtol=1e-16)


def test_k_equal_n_is_all_ones() -> None:
    z = np.array([[0.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    fwd = topk_softmax_forward(z, 3)
    np.testing.assert_array_equal(fwd.p, np.ones((2, 3)))
    np.testing.assert_array_equal(fwd.q, np.zeros((2, 3)))


def test_equal_entries_get_equal_bits_where_the_row_is_marked_elementwise() -> None:
    z = np.array([[0.0, -1.0, -2.0, -2.0, -5.0],   # two soft entries share s_k = -2 (k = 3)
                  [0.0, -1.0, -1.0, -2.0, -2.0],   # a tie at the (k-1)-th / k-th boundary
                  [0.0, -1.0, -3.0, -4.0, -4.0]])
    fwd = topk_softmax_forward(z, 3)
    np.testing.assert_array_equal(fwd.elementwise_rows, [True, False, True])
    assert fwd.p[0, 2] == fwd.p[0, 3] and fwd.q[0, 2] == fwd.q[0, 3]
    assert fwd.p[2, 3] == fwd.p[2, 4] and fwd.q[2, 3] == fwd.q[2, 4]


def test_the_api_averages_only_the_tie_rows() -> None:
    import topk_cli as st

    # row 0: the two 3s tie at the boundary (one hard, one soft), averaged by the API; row 1: two
    # soft entries share s_k (elementwise, not averaged, equal all the same)
    x = np.array([[3.0, 3.0, 2.0, 1.0], [3.0, 2.0, 2.0, 1.0]])
    res = st.evaluate(x, 2, "topk-softmax")
    e = np.exp([0.0, -1.0, -2.0])
    w = e / e.sum()
    np.testing.assert_allclose(res.weights[0], [(1 + w[0]) / 2, (1 + w[0]) / 2, w[1], w[2]], rtol=1e-15)
    e = np.exp([0.0, 0.0, -1.0])
    np.testing.assert_allclose(res.weights[1], [1.0, *(e / e.sum())], rtol=1e-15)
    assert res.weights[1, 1] == res.weights[1, 2]
