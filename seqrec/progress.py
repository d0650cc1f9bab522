"""Progress where no bar is drawn (output to a file, not a terminal): a log line every EVERY_S seconds."""

from __future__ import annotations

import time
from typing import Any

EVERY_S = 60.0


class ProgressLog:
    """Beside a tqdm `bar`: `due()` is true every EVERY_S seconds while the bar draws nothing (and `enabled`),
    for the caller to log a line; `left_s(done)` is the time left at the pace so far."""

    def __init__(self, bar: Any, total: int, enabled: bool = True) -> None:
        self.total, self.on = total, enabled and bool(bar.disable)
        self.t0 = self.said = time.perf_counter()

    def due(self) -> bool:
        now = time.perf_counter()
        if not self.on or now - self.said <= EVERY_S:
            return False
        self.said = now
        return True

    def left_s(self, done: int) -> float:
        return (time.perf_counter() - self.t0) * (self.total - done) / max(done, 1)
