"""The backend axis of the test suite (``SOFTTOPK_TEST_BACKENDS`` / ``--backends``, tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import KNOWN_BACKENDS, parse_backends

import topk_cli as st


def test_the_default_is_numpy_and_all_is_every_backend() -> None:
    assert parse_backends(None) == (["numpy"], True)
    assert parse_backends("") == (["numpy"], True)
    assert parse_backends("all") == (list(KNOWN_BACKENDS), False)
    assert parse_backends(" numpy, jax ,numpy") == (["numpy", "jax"], True)
    with pytest.raises(pytest.UsageError, match="unknown backend"):
        parse_backends("numpy,tensorflow")


def test_a_test_taking_backend_runs_once_per_selected_backend(backend: str) -> None:
    assert backend in KNOWN_BACKENDS


@pytest.mark.backends("numpy")
def test_the_numpy_backend(backend: str) -> None:
    assert backend == "numpy"
    np.testing.assert_array_equal(st.soft_topk(np.array([3.0, 1.0, 2.0]), 3, "thre-exp"), np.ones(3))
