"""Replay progress as plain lines, for logs without a terminal (CI): a line every ``every``
prompts, and at least every ``seconds`` while the replay runs (a long prompt can take minutes),
and one when the replay is done."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class ProgressLines:
    """``update`` after every prompt; ``run_ticker`` as a task for the lines between them."""

    def __init__(
        self,
        emit: Callable[[str], None],
        every: int,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emit = emit
        self.every = every
        self.seconds = seconds
        self.clock = clock
        self.started = self.last_time = clock()
        self.done: int | None = None
        self.total = 0
        self.counts: dict[str, int] = {}
        self.last_done: int | None = None

    def update(self, done: int, total: int, counts: dict[str, int]) -> None:
        self.done, self.total, self.counts = done, total, dict(counts)
        if (
            self.last_done is None
            or done >= total
            or done - self.last_done >= self.every
            or self.clock() - self.last_time >= self.seconds
        ):
            self._line()

    def tick(self) -> None:
        """A line when ``seconds`` have passed without one (and the replay has started)."""
        if self.done is not None and self.clock() - self.last_time >= self.seconds:
            self._line()

    async def run_ticker(self) -> None:
        while True:
            await asyncio.sleep(min(self.seconds, 1.0))
            self.tick()

    def _line(self) -> None:
        now = self.clock()
        self.last_done, self.last_time = self.done, now
        figures = "".join(f", {name} {n}" for name, n in self.counts.items())
        self.emit(f"replay: {self.done}/{self.total} prompts{figures}, {now - self.started:.0f}s")
