"""STUB: to be replaced by the real implementation (grad, grad-recursive)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import FloatArray, Implementation


@dataclass(frozen=True)
class RecursionTrace:
    """Per-row trace of the article's GradTopK recursion on a ``(B, n)`` batch.

    The log argument at level ``j`` (2 <= j <= k) for entry i is ``1 - Z_{j-1,i} / Z_{j-1}``
    (= 1 - p_i^(j-1), the complement of the level-(j-1) marginal) as the recursion computes it.
    """

    failed_level: NDArray[np.int64]  # level j where an argument first was <= 0; -1 if none
    kind: NDArray[np.str_]  # "ok", "log0" (argument == 0) or "log-negative" (argument < 0)
    argument: FloatArray  # the offending argument (0 or negative) at failure; NaN if none
    value_before: FloatArray  # that entry's argument at the level before the failure; NaN if none
    min_argument: FloatArray  # smallest positive argument seen before any failure (1.0 for k = 1)
    digits_lost: FloatArray  # max(0, -log10(min_argument)): decimal digits lost to cancellation


def grad_recursive_trace(z: FloatArray, k: int) -> RecursionTrace:
    raise NotImplementedError


def _todo(*args, **kwargs):
    raise NotImplementedError


GRAD = Implementation(forward=_todo, jacobian=_todo, vjp=_todo)
GRAD_RECURSIVE = Implementation(forward=_todo, jacobian=_todo, vjp=_todo)
