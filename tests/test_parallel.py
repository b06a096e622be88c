"""``--jobs N``: the parallel grid map returns the same results, in grid order, for every N."""

from __future__ import annotations

import os

import pytest
from conftest import run_cli

from topk_cli.analysis.parallel import WorkerError, available_cores, check_jobs, parallel_map, schedule
from topk_cli.errors import InvalidArgumentError, SoftTopKError


def _square_or_fail(x: int) -> int:
    if x == 3:
        raise KeyError("boom")
    if x == 4:
        raise InvalidArgumentError("bad unit 4")
    return x * x


def _die(x: int) -> int:
    os._exit(1)


def test_map_keeps_order_for_every_jobs() -> None:
    items = [5, 1, 0, 2, 7, 6]
    seen: list[tuple[int, int]] = []
    expected = [x * x for x in items]
    assert parallel_map(_square_or_fail, items, jobs=1) == expected
    assert parallel_map(_square_or_fail, items, jobs=2, progress=lambda d, t: seen.append((d, t))) == expected
    assert seen[-1] == (6, 6) and len(seen) == 6


def test_largest_first_changes_when_units_run_not_results() -> None:
    items = [5, 1, 0, 2, 7, 6, 7]
    assert schedule(items, None) == list(range(7))
    assert schedule(items, float) == [4, 6, 5, 0, 3, 1, 2]  # decreasing cost, ties in grid order
    expected = [x * x for x in items]
    assert parallel_map(_square_or_fail, items, jobs=2, cost=float) == expected
    assert parallel_map(_square_or_fail, items, jobs=1, cost=float) == expected


def test_worker_errors_become_one_clear_error() -> None:
    with pytest.raises(WorkerError, match="unit 2 of 2 failed in a worker: KeyError"):
        parallel_map(_square_or_fail, [1, 3], jobs=2)
    with pytest.raises(InvalidArgumentError, match="bad unit 4"):
        parallel_map(_square_or_fail, [1, 4], jobs=2)
    with pytest.raises(WorkerError, match="died"):
        parallel_map(_die, [1, 2], jobs=2)
    assert issubclass(WorkerError, SoftTopKError)


def test_jobs_validation() -> None:
    assert available_cores() >= 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            check_jobs(bad)
    result = run_cli("stability-probe", "--jobs", "0")
    assert result.code == 2 and "jobs must be an integer >= 1" in result.err


@pytest.mark.parametrize(
    "args",
    [
        ["stability-probe", "-n", "10,40", "-k", "1,5", "--scales", "0.1:1e4:4", "--trials", "3", "--seed", "7"],
        ["verify-properties", "--values", "3,1,2,2,5", "--seed", "3"],
    ],
)
def test_cli_json_identical_for_jobs_1_and_2(args: list[str]) -> None:
    outs = [run_cli(*args, "--format", "json", "--jobs", j) for j in ("1", "2")]
    assert all(r.code in (0, 1) for r in outs), [r.err for r in outs]
    assert outs[0].out == outs[1].out
