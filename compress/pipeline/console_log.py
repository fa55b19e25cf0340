"""Where the library's log records go during a run: the run's rich console.

Library code (stages, algorithms, the training loop) logs through ``logging`` and never
prints. While a run is in progress this handler turns those records into the stage-prefixed
lines the user reads: rich styling on a terminal, plain text when stderr is a file or a CI
log (rich decides from the console). Outside a run, records go wherever the embedding
application's logging sends them.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

from rich.console import Console
from rich.markup import escape

LIBRARY_LOGGERS = ("compress", "train", "export", "serve_bench")
_LEVEL_STYLE = {logging.WARNING: "yellow", logging.ERROR: "red", logging.CRITICAL: "bold red"}
# Where output goes to a file or a CI log, rich would assume 80 columns and cut table cells
# ("train.m…"); a log has no width, so tables get room for full artifact names and paths.
LOG_WIDTH = 200


def cli_console(stderr: bool = True) -> Console:
    """The console the command line prints to: the terminal's width, or LOG_WIDTH where it is no terminal
    (a set COLUMNS still wins)."""
    console = Console(stderr=stderr, soft_wrap=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, soft_wrap=stderr, width=LOG_WIDTH)
    return console


class ConsoleHandler(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__(level=logging.INFO)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = escape(record.getMessage())  # messages hold things like compress[tensorrt], not markup
            style = getattr(record, "style", None) or _LEVEL_STYLE.get(record.levelno)
            if style:
                text = f"[{style}]{text}[/]"
            stage = getattr(record, "stage", None)
            self.console.print(f"[bold]{escape(stage)}[/]: {text}" if stage else text, highlight=False)
        except Exception:  # a broken console must not break the run; logging's own policy
            self.handleError(record)


@contextlib.contextmanager
def to_console(console: Console) -> Iterator[None]:
    """Send the library's records at INFO and above to ``console`` for the duration of a block."""
    handler = ConsoleHandler(console)
    saved = []
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.propagate))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, level, propagate in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
