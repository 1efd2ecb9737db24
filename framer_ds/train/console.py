"""Output while the progress bar is on screen: above it, never through it.

Why: an eval line printed with `print` while tqdm redraws its bar lands in the middle of the bar's line,
and a warning raised by a library (transformers, DeepSpeed) does the same on stderr. tqdm.write moves
the bar out of the way; the logging and warnings redirections below send library output the same way.
"""

from __future__ import annotations

import contextlib
import logging
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
    """While training: Python warnings and the log records of every configured logger go through
    tqdm.write, so they print above the bar."""
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
        tqdm.write(text, file=file)

    loggers = [logging.getLogger()] + [
        logging.getLogger(name) for name in logging.root.manager.loggerDict if not name.startswith("tqdm")
    ]
    warnings.showwarning = show
    try:
        with logging_redirect_tqdm(loggers=[lg for lg in loggers if isinstance(lg, logging.Logger)]):
            yield
    finally:
        warnings.showwarning = original
