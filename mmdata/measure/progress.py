"""`SettlingLine`: one line on the terminal while `num_workers="auto"` settles, so a benchmark's first minute is
not silent: the step, the tuner's latest setting and why it chose it."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

# How often the line is redrawn at most; a loader's stats() costs a snapshot of its totals.
REDRAW_SECONDS = 0.5


class SettlingLine:
    """Called after every step with (steps done, steps in all); redraws one line on a terminal, or, on a stream that
    is not one (a log, a CI job), writes a line each time the tuner changes its setting. `stats` gives the loader's
    `stats()`; a loader without a tuner writes nothing."""

    def __init__(self, stats: Any, stream: TextIO | None = None, redraw_seconds: float = REDRAW_SECONDS):
        self._stats, self._stream = stats, stream if stream is not None else sys.stderr
        self._redraw_seconds = redraw_seconds
        self._terminal = self._stream.isatty()
        self._drawn_at = -float("inf")
        self._settings_seen = -1  # (the first call writes a line on any stream)
        self._width = 0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._drawn_at < self._redraw_seconds and done < total:
            return
        self._drawn_at = now
        stats = self._stats()
        tuning = stats.get("autotune")
        if not tuning:
            return
        settings = tuning["settings"]
        text = (
            f"auto: step {done}/{total}, {stats['workers']} of at most {tuning['most_workers']} workers,"
            f" read-ahead {tuning['read_ahead']}"
        )
        if settings:
            latest = settings[-1]
            text += f", stall {latest['stall']:.1%}, {latest['steps_per_second']:.1f} steps/s: {latest['reason']}"
        else:
            text += ": measuring its first window"
        if self._terminal:
            self._stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
            if done >= total:
                self._stream.write("\n")
        elif len(settings) > self._settings_seen or done >= total:
            self._stream.write(text + "\n")
        self._settings_seen = len(settings)
        self._stream.flush()
