"""The Jacobian check does not judge a derivative where the operator is discontinuous.

topk-softmax puts a hard 1 on the top k - 1 scores and a softmax over the rest, so it jumps where
its (k-1)-th and k-th scores tie (which of the tied entries gets the 1 flips). At such a point p has
no derivative: its value there is the tie average, a finite difference along an untied coordinate
measures that average's slope, and the analytic Jacobian is one branch's. On
``x = 2, 1, 1, 1, 0``, k = 3, the check used to compare them (dp[1]/dx[4]: analytic 0, finite
differences -0.044) and ``verify-properties -m topk-softmax -k 3 --strict`` exited 1.
"""

from __future__ import annotations

import json

import numpy as np
from conftest import run_cli

from topk_cli.properties import Case, check_jacobian
from topk_cli.properties.evaluator import Evaluator
from topk_cli.properties.violations import _v_jacobian


def test_a_tie_at_the_jump_is_not_judged_and_a_point_beside_it_is() -> None:
    ev = Evaluator()
    at_tie = _v_jacobian(ev, "topk-softmax", np.array([2.0, 1.0, 1.0, 1.0, 0.0]), 3, 1.0)
    assert at_tie is None  # discontinuous there: no derivative to judge
    beside = _v_jacobian(ev, "topk-softmax", np.array([2.0, 1.5, 1.0, 0.5, 0.0]), 3, 1.0)
    assert beside is not None and not beside.failed and beside.value < 1e-6  # judged, and right


def test_a_tie_away_from_the_jump_is_still_judged() -> None:
    # a tie that does not straddle the jump (the 4th and 5th scores, k = 3) is a smooth point
    result = check_jacobian("topk-softmax", [Case((2.0, 1.5, 1.0, 0.0, 0.0), 3)])
    assert result.holds is True and result.checked == 1


def test_topk_softmax_passes_strict_at_k_3() -> None:
    code, out, err = run_cli("verify-properties", "-m", "topk-softmax", "-k", "3", "--strict", "--format", "json", "--jobs", "1")
    assert code == 0, err
    jac = next(r for r in json.loads(out)["results"] if r["property"] == "jacobian")
    assert jac["violations"] == 0 and jac["checked"] >= 30, jac
