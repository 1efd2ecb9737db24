"""Decisions one process makes for all: rank 0 runs it, every rank gets the result or the error.

Why: a choice each rank made alone (which checkpoint is `latest`, whether the lock was free) can
differ between ranks whose views of a file system differ, and an exception on rank 0 alone leaves the
other ranks waiting in the next collective until the timeout. Here rank 0's outcome, value or error,
is broadcast, so every rank returns the same value or raises the same error at the same point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from framer_ds.config.errors import ConfigError, ConfigProblem, RunSetupError

T = TypeVar("T")


def decided_by_rank_zero(accelerator: Accelerator, decide: Callable[[], T]) -> T:
    """`decide()` on rank 0; its (picklable) return value on every rank, or its error raised on every
    rank (a ConfigError as itself, anything else as a RunSetupError on the other ranks). Every rank."""
    outcome: list = [None]
    error: BaseException | None = None
    if accelerator.is_main_process:
        try:
            outcome = [("value", decide())]
        except ConfigError as exc:
            error, outcome = exc, [("config", [(p.where, p.message) for p in exc.problems], exc.source)]
        except Exception as exc:  # shared below, then re-raised with its traceback on rank 0
            error, outcome = exc, [("error", f"{type(exc).__name__}: {exc}")]
    if accelerator.num_processes > 1:
        broadcast_object_list(outcome, from_process=0)
    kind, *payload = outcome[0]
    if kind == "value":
        return payload[0]
    if error is not None:
        raise error
    if kind == "config":
        problems, source = payload
        raise ConfigError([ConfigProblem(where, message) for where, message in problems], source)
    raise RunSetupError(f"rank 0 failed: {payload[0]}")
