"""An interrupt during a parallel map leaves no pool thread behind.

concurrent.futures' exit hook writes to the wake-up pipe of every pool manager thread still
registered; if that thread is closing the pipe at the same moment, Python prints
'Exception ignored ... OSError: Bad file descriptor' after the command's own 'interrupted' line
(seen once in CI). ``_terminate`` therefore joins the manager thread, which it must take before
``shutdown()`` drops the pool's reference to it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from topk_cli.analysis.parallel import _terminate, parallel_map


class _Pool:
    """What ``_terminate`` reads of a ProcessPoolExecutor, with a manager thread still winding down
    (closing its pipe) when ``shutdown`` returns, and ``shutdown`` dropping the reference as
    CPython's does."""

    def __init__(self) -> None:
        self._processes: dict[int, Any] = {}
        self._call_queue = None
        self._executor_manager_thread: threading.Thread | None = threading.Thread(target=time.sleep, args=(0.5,))
        self._executor_manager_thread.start()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._executor_manager_thread = None


def test_terminate_joins_the_manager_thread() -> None:
    pool = _Pool()
    manager = pool._executor_manager_thread
    assert manager is not None and manager.is_alive()
    _terminate(pool)  # type: ignore[arg-type]
    assert not manager.is_alive()


def _slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_map_propagates_and_stops(exc: type[BaseException]) -> None:
    calls: list[int] = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        raise exc("stop")

    with pytest.raises(exc):
        parallel_map(_slow_square, list(range(40)), jobs=2, progress=progress)
    assert calls == [calls[0]] and calls[0] >= 1  # the interrupt landed mid-map and stopped it
