"""Reading the rows a producer appended to a ``deque`` since the last read, without a counter
in the producer (the step monitor's spans and memory samples, read by the rank writer)."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

import numpy as np


class RowTail:
    """Copies the rows appended to a ``deque`` since the last call, without a counter in the
    producer: the last row copied is found again by identity, searching from the right (a
    bounded deque may have let rows go that were never copied: then all it holds is new)."""

    def __init__(self) -> None:
        self.last: object = None
        self._window = 64

    def new_rows(self, dq: deque[Any]) -> list[Any]:
        k = self._window
        while True:
            # one C call (no Python code runs inside, so no other thread appends meanwhile)
            tail = list(itertools.islice(reversed(dq), k))
            found = -1
            if self.last is not None:
                for i, row in enumerate(tail):
                    if row is self.last:
                        found = i
                        break
            if found >= 0 or len(tail) < k:
                new = tail[:found] if found >= 0 else tail
                new.reverse()
                if new:
                    self.last = new[-1]
                self._window = max(64, 2 * len(new))
                return new
            k *= 4


def rows_since(dq: Any, tail: RowTail, dtype: np.dtype) -> np.ndarray:
    """The rows ``tail`` has not handed out yet, as an array of ``dtype``."""
    if not isinstance(dq, deque):
        return np.zeros(0, dtype)
    new = tail.new_rows(dq)
    return np.array(new, dtype=dtype) if new else np.zeros(0, dtype)


__all__ = ["RowTail", "rows_since"]
