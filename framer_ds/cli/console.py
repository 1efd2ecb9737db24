"""Lines for the user on stderr, each written whole.

Why: every rank of a launch reports its error on the same stderr, and launchers run Python unbuffered
(`PYTHONUNBUFFERED`), where `print(text, file=sys.stderr)` is two writes (the text, then the newline).
Two ranks' lines then ran together ("... start a new runerror: ..."). One `write` of a line shorter than
PIPE_BUF (4096 bytes) reaches a pipe whole.
"""

from __future__ import annotations

import sys


def tell(line: str) -> None:
    """`line` and its newline on stderr in one write."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def tell_error(message: str) -> None:
    tell(f"error: {message}")
