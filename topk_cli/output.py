"""Writing results: stdout or an atomically replaced file. The only writer of output files."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from topk_cli.errors import InputError


def write_text(text: str | Iterable[str], path: Path | None) -> None:
    """Write ``text`` (a string or an iterable of chunks) to stdout or atomically to ``path``.

    ``path`` None or ``-`` means stdout. A file is written to a temporary sibling and renamed
    over the target, so a failure never leaves a truncated or half-written file behind; it gets
    the permissions a plain ``open()`` would give (the existing file's mode, else 0666 & ~umask).
    Chunks are written as they come, so a large result never needs one huge string.

    Raises:
        InputError: the target directory does not exist or is not writable.
    """
    chunks = [text] if isinstance(text, str) else text
    if path is None or str(path) == "-":
        for chunk in chunks:
            sys.stdout.write(chunk)
        sys.stdout.flush()
        return
    _replace_atomically(Path(path), (chunk.encode("utf-8") for chunk in chunks))


def write_bytes(data: bytes, path: Path) -> None:
    """Write ``data`` (e.g. a PNG) atomically to ``path``, like :func:`write_text`.

    Raises:
        InputError: the target directory does not exist or is not writable.
    """
    _replace_atomically(Path(path), [data])


def _replace_atomically(target: Path, chunks: Iterable[bytes]) -> None:
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"cannot write {target}: directory {directory} does not exist")
    if target.is_dir():
        raise InputError(f"cannot write {target}: it is a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror}") from None
    umask = os.umask(0)
    os.umask(umask)  # read the umask without changing it
    mode = (target.stat().st_mode & 0o7777) if target.exists() else (0o666 & ~umask)
    try:
        os.chmod(tmp, mode)  # mkstemp creates 0600
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
