"""Progress output that suits where it is read.

On a terminal a live rich bar (loss, lr, throughput, ETA); in a log file or CI a live
bar is noise, so one heartbeat record every ~30 s instead (through ``logging``), enough to
see a run is alive and how fast it goes without flooding the log.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import TextIO


logger = logging.getLogger(__name__)


def _fmt_eta(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class StepProgress:
    def __init__(self, label: str, total: int, initial: int = 0, *, heartbeat_s: float = 30.0,
                 stream: TextIO | None = None, live: bool | None = None) -> None:
        self.label, self.total, self.initial = label, total, initial
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.heartbeat_s = heartbeat_s
        self._start = time.monotonic()
        self._last_beat = self._start
        self._progress = None
        self._task = None
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"), TimeRemainingColumn(),
                console=Console(file=self.stream), transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(label, total=total, completed=initial, stats="")

    def update(self, step: int, **stats: float) -> None:
        text = "  ".join(self._fmt(k, v) for k, v in stats.items())
        if self._progress is not None:
            self._progress.update(self._task, completed=step, stats=text)
            return
        now = time.monotonic()
        if now - self._last_beat >= self.heartbeat_s or step == self.total:
            self._last_beat = now
            done = step - self.initial
            rate = done / max(now - self._start, 1e-9)
            eta = (self.total - step) / rate if rate > 0 else 0.0
            logger.info(f"{self.label}: step {step}/{self.total} ({100 * step / max(1, self.total):.0f}%) {text} "
                        f"eta {_fmt_eta(eta)}")

    def message(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            logger.info(text)

    @staticmethod
    def _fmt(key: str, value: float) -> str:
        if key == "lr":
            return f"lr {value:.2e}"
        if key == "img_s":
            return f"{value:,.0f} img/s"
        return f"{key} {value:.4f}"

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> "StepProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _eta_since_start_column():
    """rich's TimeRemainingColumn estimates speed from the last 30 s of updates only, so a bar updated less often
    (a search trial of minutes, a one-minute traffic test) never shows an ETA: this one projects the average
    rate since the bar started over what is left."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class EtaSinceStart(ProgressColumn):
        def render(self, task) -> Text:
            elapsed, total = task.elapsed, task.total
            done_here = task.completed - task.fields.get("initial", 0)  # a resumed search's earlier trials took no time here
            if not elapsed or not total or done_here <= 0:
                return Text("-:--:--", style="progress.remaining")
            left = elapsed * max(0.0, total - task.completed) / done_here
            return Text(_fmt_eta(left), style="progress.remaining")

    return EtaSinceStart()


class LiveBar:
    """A bar with an ETA for a step that takes more than a few seconds (bench rounds, traffic tests, search trials).

    Drawn on a terminal and gone when the step ends (the step's own lines stay); where the output is not a
    terminal (a log file, CI) it draws nothing and logs nothing, because those readers already get the step's
    own lines. ``total`` may be an upper bound: ``close`` completes it. ``initial``: what was done before this
    process (a resumed search's trials), which the ETA's rate leaves out.
    """

    def __init__(self, label: str, total: float, *, initial: float = 0, stream: TextIO | None = None,
                 live: bool | None = None) -> None:
        stream = stream or sys.stderr
        self.live = (stream.isatty() if live is None else live) and total > 0
        self._progress = None
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                                      _eta_since_start_column(), TextColumn("{task.fields[note]}"),
                                      console=Console(file=stream, force_terminal=True), transient=True,
                                      auto_refresh=False)  # no drawing thread beside a measurement: drawn on update
            self._progress.start()
            self._task = self._progress.add_task(label, total=total, completed=initial, initial=initial, note="")

    def update(self, completed: float | None = None, *, advance: float | None = None, note: str = "") -> None:
        if self._progress is None:
            return
        if completed is not None:
            self._progress.update(self._task, completed=completed, note=note)
        else:
            self._progress.update(self._task, advance=advance or 1, note=note)
        self._progress.refresh()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> "LiveBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
