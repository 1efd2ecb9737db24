"""Task registry and the built-in tasks."""

from framer_ds.tasks.base import Task
from framer_ds.tasks.registry import available_tasks, get_task_class, register_task

__all__ = ["Task", "available_tasks", "get_task_class", "register_task"]
