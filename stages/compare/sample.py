"""One comparison step as every task metric reads it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sample:
    """One comparison step: the inputs fed, and every output of the reference and of the candidate by name (a
    metric of one output may need the others: a detector's scores and boxes in separate outputs)."""
    feed: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    candidate: dict[str, np.ndarray]
