"""Task registry and the built-in tasks.

`from framer_ds.tasks import Task, register_task` works as before, but resolves on first use: every
`framer-ds` process imports `framer_ds.tasks.registry` to build its parser, and must not pay for
`tasks.base` (torch) there."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Task": "framer_ds.tasks.base",
    "available_tasks": "framer_ds.tasks.registry",
    "get_task_class": "framer_ds.tasks.registry",
    "register_task": "framer_ds.tasks.registry",
}

__all__ = ["Task", "available_tasks", "get_task_class", "register_task"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
