"""An interrupt during a parallel map leaves no pool thread behind.

concurrent.futures' exit hook writes to the wake-up pipe of every pool manager thread still
registered; if that thread is closing the pipe at the same moment, Python prints
'Exception ignored ... OSError: Bad file descriptor' after the command's own 'interrupted' line.
The map therefore waits for the manager thread to end before the interrupt propagates.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import process as futures_process

import pytest

from topk_cli.analysis.parallel import parallel_map


def _slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


def _managers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if isinstance(t, futures_process._ExecutorManagerThread)]


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupted_map_joins_its_manager_thread(exc: type[BaseException], monkeypatch: pytest.MonkeyPatch) -> None:
    assert _managers() == []
    close = futures_process._ThreadWakeup.close

    def slow_close(self: futures_process._ThreadWakeup) -> None:  # widen the race window to 0.3 s
        time.sleep(0.3)
        close(self)

    monkeypatch.setattr(futures_process._ThreadWakeup, "close", slow_close)
    calls: list[int] = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        raise exc("stop")

    with pytest.raises(exc):
        parallel_map(_slow_square, list(range(40)), jobs=2, progress=progress)
    assert calls == [calls[0]] and calls[0] >= 1  # the interrupt did land mid-map
    assert _managers() == []
