"""Writing results: stdout, an atomically replaced file, or a special file written through.

The only writer of output files.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from topk_cli.errors import InputError, InvalidArgumentError


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
    """Write ``chunks`` to ``target``: atomically for a regular file, straight through otherwise.

    A symlink is followed (the link stays, the file it points to is replaced); a FIFO, a device
    (``/dev/null``, a terminal) or a socket is opened and written, never replaced. The temporary
    file is ``.NAME.softtopk-tmp-XXXXXXXX`` next to the target and is removed on any failure,
    including SIGINT and SIGTERM (the CLI turns both into exceptions).
    """
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    if target.exists() and not target.is_file():
        if target.is_dir():
            raise InputError(f"cannot write {target}: it is a directory")
        _write_through(target, chunks)
        return
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"cannot write {target}: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.softtopk-tmp-", dir=directory)
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror}") from None
    umask = os.umask(0)
    os.umask(umask)  # read the umask without changing it
    try:
        mode = (target.stat().st_mode & 0o7777) if target.exists() else (0o666 & ~umask)
        os.chmod(tmp, mode)  # mkstemp creates 0600
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write {target}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_through(target: Path, chunks: Iterable[bytes]) -> None:
    try:
        with open(target, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror or exc}") from None


#: Output formats implied by the suffix of ``-o`` when ``--format`` is not given.
FORMAT_BY_SUFFIX = {".csv": "csv", ".json": "json", ".txt": "table"}

#: Image formats of ``--plot``, by suffix.
PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def output_format(given: str | None, path: Path | None) -> str:
    """The result's format: ``--format`` if given, else the one the ``-o`` suffix implies.

    ``.csv`` gives csv, ``.json`` json; any other suffix (``.txt``, none) or stdout gives the
    table. A given format that contradicts a ``.csv`` or ``.json`` suffix is refused.

    Raises:
        InvalidArgumentError: ``--format json -o out.csv`` and the like.

    >>> output_format(None, Path("out.CSV")), output_format("json", None), output_format(None, Path("out"))
    ('csv', 'json', 'table')
    """
    implied = FORMAT_BY_SUFFIX.get(Path(path).suffix.lower()) if path is not None and str(path) != "-" else None
    if given is None:
        return implied or "table"
    if implied is not None and implied != "table" and given != implied:
        raise InvalidArgumentError(
            f"--format {given} contradicts the suffix of -o {path} ({implied}); drop --format or change the suffix"
        )
    return given


def plot_format(path: Path) -> str:
    """The image format of ``--plot PATH`` from its suffix: png, svg or pdf.

    Raises:
        InvalidArgumentError: any other suffix.
    """
    fmt = PLOT_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InvalidArgumentError(
            f"--plot {path}: the file name must end in .png, .svg or .pdf (the image format), got {Path(path).suffix or 'no suffix'!r}"
        )
    return fmt


def check_output_path(path: Path | None, option: str) -> None:
    """Refuse, before anything is computed, an output path that could not be written.

    ``None`` or ``-`` (stdout) passes. The path must not be a directory; an existing FIFO,
    device or socket is written through; otherwise its directory must exist, be a directory
    and be writable (the file is written atomically through a temporary sibling).

    Raises:
        InvalidArgumentError: the path cannot be written; the message names the option.
    """
    if path is None or str(path) == "-":
        return
    target = Path(path)
    if str(path).endswith(os.sep) or target.is_dir():
        raise InvalidArgumentError(f"{option} {path}: is a directory; give a file name")
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    if target.exists() and not target.is_file():
        return  # a FIFO, device or socket: written through
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.exists():
        raise InvalidArgumentError(f"{option} {path}: directory {directory} does not exist")
    if not directory.is_dir():
        raise InvalidArgumentError(f"{option} {path}: {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"{option} {path}: directory {directory} is not writable")
