"""A deterministic parallel map for the grids of the analysis commands (``--jobs N``).

Every unit of a grid is a pure function of its own arguments (its random draws are keyed by the
seed and the unit, never by the order units run in), and results are returned in grid order, so
the output is identical for every number of jobs. ``jobs == 1`` runs in-process.

With several jobs, units are handed out largest first (by the caller's cost estimate) and each
idle worker takes the next one, so the cheap units fill the gaps at the end instead of a costly
unit starting last while the other cores idle (longest-processing-time-first list scheduling:
Graham, "Bounds on multiprocessing timing anomalies", SIAM J. Appl. Math. 17, 1969).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from topk_cli.errors import InvalidArgumentError, SoftTopKError

T = TypeVar("T")
R = TypeVar("R")


class WorkerError(SoftTopKError, RuntimeError):
    """A worker process of a parallel grid died or raised an unexpected error."""


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    counter = getattr(os, "process_cpu_count", None)  # Python >= 3.13
    if counter is not None:
        return max(1, counter() or 1)
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_jobs(jobs: object) -> int:
    """``jobs`` as an int >= 1, or :class:`InvalidArgumentError`."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise InvalidArgumentError(f"jobs must be an integer >= 1, got {jobs!r}")
    return jobs


def parallel_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
    cost: Callable[[T], float] | None = None,
) -> list[R]:
    """``[fn(item) for item in items]``, on up to ``jobs`` processes, in the order of ``items``.

    ``fn`` must be a module-level function (it is pickled). A :class:`SoftTopKError` raised by a
    unit is re-raised as is; any other failure of a worker becomes a :class:`WorkerError` naming
    the unit. On an interrupt (Ctrl-C) or error, pending units are cancelled and the workers are
    terminated before the exception propagates. ``progress(done, total)`` is called as units end.
    ``cost(item)`` estimates a unit's run time (any consistent unit): with several jobs the units
    start in decreasing cost (ties in ``items`` order); it changes when units run, never results.

    >>> parallel_map(abs, [-2, 3, -1], jobs=1)
    [2, 3, 1]
    """
    jobs = min(check_jobs(jobs), max(1, len(items)))
    total = len(items)
    if jobs == 1:
        out = []
        for i, item in enumerate(items):
            out.append(fn(item))
            if progress is not None:
                progress(i + 1, total)
        return out
    results: dict[int, R] = {}
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init)
    try:
        order = schedule(items, cost)
        futures: dict[Future[R], int] = {pool.submit(fn, items[i]): i for i in order}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                i = futures[future]
                try:
                    results[i] = future.result()
                except SoftTopKError:
                    raise
                except BrokenProcessPool as exc:
                    raise WorkerError(f"a worker process died while computing unit {i + 1} of {total} ({exc}); "
                                      "retry with --jobs 1") from None
                except Exception as exc:  # an unexpected error inside a worker: one clear line
                    raise WorkerError(f"unit {i + 1} of {total} failed in a worker: "
                                      f"{type(exc).__name__}: {exc}") from None
                if progress is not None:
                    progress(len(results), total)
    except BaseException:
        _terminate(pool)
        raise
    pool.shutdown(wait=True)
    return [results[i] for i in range(total)]


def schedule(items: Sequence[T], cost: Callable[[T], float] | None) -> list[int]:
    """Indices of ``items`` in the order they are handed to workers: decreasing ``cost``, stable.

    >>> schedule(["a", "bbb", "cc", "ddd"], len)
    [1, 3, 2, 0]
    """
    if cost is None:
        return list(range(len(items)))
    costs = [float(cost(item)) for item in items]
    return sorted(range(len(items)), key=lambda i: -costs[i])


def _worker_init() -> None:
    """Give a worker the default action of SIGTERM (exit at once), whatever handler it inherited.

    A handler that raises (the command line's, which unwinds so temporary files are removed)
    would be caught by the pool's worker loop as the unit's error, and the worker would go on
    with the units already queued to it: :func:`_terminate` could not stop it.
    """
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and kill the workers (so no process outlives an interrupt)."""
    processes = dict(getattr(pool, "_processes", None) or {})
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() drops the reference
    call_queue = getattr(pool, "_call_queue", None)
    if call_queue is not None:  # its feeder thread may be blocked on a pipe no worker will read:
        call_queue.cancel_join_thread()  # do not wait for it at exit (multiprocessing's documented escape)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in list(processes.values()):
        if process.is_alive():
            process.terminate()
    for process in list(processes.values()):
        process.join(timeout=5)
    # Let the pool's manager thread finish (it closes its wake-up pipe as it goes) before the
    # interpreter exits: otherwise concurrent.futures' exit hook may write to that pipe while the
    # thread closes it, and print 'Exception ignored ... Bad file descriptor' after our one line.
    if manager is not None and manager.is_alive():
        manager.join(timeout=5)
