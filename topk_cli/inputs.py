"""STUB (owned by the compute/inputs helper): load vectors from CSV/JSON/NPY/stdin/--values.

The only pandas importer. Contract used by every command:

    load_input(path, *, values=None, column=None, input_format=None) -> LoadedInput
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class LoadedInput:
    """Vectors read from one source: ``values`` is always 2-D ``(rows, n)``."""

    values: NDArray[np.float64]
    labels: tuple[str, ...]  # one per entry (column), length n
    row_names: tuple[str, ...]  # one per row
    source: str  # file name, "<stdin>" or "--values"

    @property
    def single(self) -> bool:
        """True when the source held one vector (not a batch)."""
        return self.values.shape[0] == 1


def load_input(
    path: str | None,
    *,
    values: str | None = None,
    column: str | None = None,
    input_format: str | None = None,
) -> LoadedInput:
    raise NotImplementedError
