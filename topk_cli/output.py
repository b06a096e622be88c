"""Writing results: stdout or an atomically replaced file. The only writer of output files."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from topk_cli.errors import InputError


def write_text(text: str, path: Path | None) -> None:
    """Write ``text`` to stdout (``path`` None or ``-``) or atomically to ``path``.

    The file is written to a temporary sibling and renamed over the target, so a failure never
    leaves a truncated or half-written file behind.

    Raises:
        InputError: the target directory does not exist or is not writable.
    """
    if path is None or str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"cannot write {target}: directory {directory} does not exist")
    if target.is_dir():
        raise InputError(f"cannot write {target}: it is a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
