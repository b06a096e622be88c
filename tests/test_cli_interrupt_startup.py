"""Ctrl-C at any moment of start-up ends in one line, ``softtopk: interrupted``, and exit 130.

The child runs the console script's own lines (``from topk_cli.cli import main``) or
``python -m topk_cli``'s (``runpy``) after writing a marker, so the delays are measured from the
moment the program's own code starts, not from the interpreter's start-up (a signal during
Python's own initialisation, before any line of the program runs, is Python's to report).
The modules are compiled once first (into a private cache), as in an installed package: with
``PYTHONDONTWRITEBYTECODE`` every start would first compile ``cli.py`` from source, before any
of its lines can run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

#: The console script pip writes for ``softtopk = "topk_cli.cli:main"``, after the marker.
CONSOLE = (
    "import re\nimport sys\nsys.argv[0] = '/venv/bin/softtopk'\nsys.stderr.write('ready\\n'); sys.stderr.flush()\n"
    "from topk_cli.cli import main\n"
    "if __name__ == '__main__':\n"
    "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
    "    sys.exit(main())"
)
MODULE = (
    "import runpy, sys\nsys.stderr.write('ready\\n'); sys.stderr.flush()\n"
    "runpy.run_module('topk_cli', run_name='__main__', alter_sys=True)"
)
#: From 20 ms after the marker: the first few milliseconds belong to the import system locating
#: and loading the package and its ``__init__`` (which must not touch signal handling: importing
#: the library is not running the tool), before ``cli.py``'s first line installs the handler
#: (measured on an idle core: a signal at 0-1 ms hit importlib's own frames, at 3 ms and later none
#: in 40 runs). The margin is for CI, where the other test worker shares the 2 cores and a
#: wall-clock delay buys half the CPU; the imports of ``cli.py`` itself last 100 ms and more, so
#: these delays still land inside them.
DELAYS = (0.02, 0.03, 0.045, 0.065, 0.09, 0.12, 0.16, 0.25, 0.4)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")
@pytest.mark.parametrize("prelude", [CONSOLE, MODULE], ids=["console-script", "python-m"])
def test_interrupt_during_start_up_is_one_line_and_exit_130(prelude: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-c", prelude, "compute", "-k", "2", "--values", "3,2,1,4", "-m", "all"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    warm = subprocess.run(argv, capture_output=True, env=env, timeout=300)  # compiles every module once
    assert warm.returncode == 0, warm.stderr
    interrupted = 0
    for delay in DELAYS:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert child.stderr is not None
        assert child.stderr.readline() == b"ready\n"
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        _out, err = child.communicate(timeout=120)
        text = err.decode()
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, (delay, text)
        if child.returncode == 130:
            assert text.endswith("softtopk: interrupted\n"), (delay, text)
            interrupted += 1
        else:  # finished before the signal arrived
            assert child.returncode == 0, (delay, child.returncode, text)
    assert interrupted >= len(DELAYS) // 2, f"only {interrupted} of {len(DELAYS)} runs were interrupted"


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")
def test_interrupt_as_the_command_ends_keeps_a_clean_exit(tmp_path: Path) -> None:
    """Around the end of a run (the result written, Python tearing down), Ctrl-C leaves exit 0 or 130
    and no traceback, never a process killed by SIGINT."""
    argv = [sys.executable, "-c", CONSOLE, "compute", "-k", "2", "--values", "3,2,1,4", "-m", "all"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run(argv, capture_output=True, env=env, timeout=300)
    spans = []
    for _ in range(2):
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert child.stderr is not None and child.stderr.readline() == b"ready\n"
        start = time.perf_counter()
        child.communicate(timeout=120)
        spans.append(time.perf_counter() - start)
    span = min(spans)
    for fraction in (0.9, 0.95, 0.98, 1.0, 1.02, 1.05, 0.97, 0.99, 1.01, 1.03):
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert child.stderr is not None and child.stderr.readline() == b"ready\n"
        time.sleep(span * fraction)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
        text = err.decode()
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, (fraction, text)
        assert child.returncode in (0, 130), (fraction, child.returncode, text)
