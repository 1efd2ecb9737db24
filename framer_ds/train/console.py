"""Output while the progress bar is on screen: above it, never through it.

Why: an eval line printed with `print` while tqdm redraws its bar lands in the middle of the bar's line,
and a warning raised by a library (transformers, DeepSpeed) does the same on stderr. tqdm.write moves
the bar out of the way; the logging and warnings redirections below send library output the same way.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator

from accelerate import Accelerator
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


def say(accelerator: Accelerator, message: str) -> None:
    """A line for the user from the main process, printed above an active progress bar."""
    if accelerator.is_main_process:
        tqdm.write(message)


@contextlib.contextmanager
def above_the_progress_bar() -> Iterator[None]:
    """While training: Python warnings and the log records that would reach the console go through
    tqdm.write, so they print above the bar (`_console_loggers`)."""
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
        tqdm.write(text, file=file)

    warnings.showwarning = show
    try:
        with logging_redirect_tqdm(loggers=_console_loggers()):
            yield
    finally:
        warnings.showwarning = original


def _prints_to_console(logger: logging.Logger) -> bool:
    return any(
        isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr) for h in logger.handlers
    )


def _console_loggers() -> list[logging.Logger]:
    """The root logger (every logger that propagates prints through it) and each named logger with a
    console handler of its own. Not the others: tqdm's redirection gives every logger it is handed a
    console handler, so a logger meant to print nowhere (torch.distributed.checkpoint's telemetry:
    DEBUG, a NullHandler, no propagation) would print a dict per checkpoint phase on every rank."""
    named = [
        logger
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and not name.startswith("tqdm") and _prints_to_console(logger)
    ]
    return [logging.getLogger(), *named]
