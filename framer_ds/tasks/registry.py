"""`@register_task` and lookup with "did you mean" suggestions."""

from __future__ import annotations

import importlib

from framer_ds.config.errors import ConfigError, ConfigProblem, did_you_mean
from framer_ds.tasks.base import Task

_TASKS: dict[str, type[Task]] = {}

# The built-in tasks and the module that registers each. A run imports only its own task's module: all
# four pull in transformers, diffusers, peft and their models (~5-10 s of CPU per process), which every
# rank of every launch paid before, whatever it trained. Listing the tasks imports them all.
BUILTIN_TASKS: dict[str, str] = {
    "vit_classification": "framer_ds.tasks.vit_classification.task",
    "video_lora": "framer_ds.tasks.video_lora.task",
    "tts_lm": "framer_ds.tasks.tts_lm.task",
    "drivable_vit": "framer_ds.tasks.drivable_vit.task",
}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make a Task available under `cls.name`."""
    existing = _TASKS.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(
            f"task name {cls.name!r} is registered twice ({existing.__module__}, {cls.__module__})"
        )
    _TASKS[cls.name] = cls
    return cls


def _load_builtin_tasks() -> None:
    for module in BUILTIN_TASKS.values():
        importlib.import_module(module)


def is_registered(name: str) -> bool:
    """True when `name` is a task: registered already (an `imports:` module), or a built-in one, whose
    module is imported now (only that one)."""
    if name not in _TASKS and name in BUILTIN_TASKS:
        importlib.import_module(BUILTIN_TASKS[name])
    return name in _TASKS


def available_tasks() -> dict[str, str]:
    """Registered task names -> one-line summaries."""
    _load_builtin_tasks()
    return {name: _TASKS[name].summary for name in sorted(_TASKS)}


def unknown_task_problem(name: str) -> ConfigProblem:
    names = available_tasks()
    return ConfigProblem(
        "task",
        f"unknown task {name!r}.{did_you_mean(name, names)} Registered tasks: {', '.join(names)}"
        " (`framer-ds tasks` describes them; a task of your own needs its module in `imports:`).",
    )


def get_task_class(name: str) -> type[Task]:
    if not is_registered(name):
        raise ConfigError([unknown_task_problem(name)], "config")
    return _TASKS[name]


def tasks_serving(method: str) -> list[str]:
    """The registered tasks that implement the Task hook `method` (override the base's refusal)."""
    _load_builtin_tasks()
    default = getattr(Task, method)
    return sorted(name for name, cls in _TASKS.items() if getattr(cls, method) is not default)


def task_hook_refusal(task: Task, method: str, command: str) -> ConfigError:
    """What a task-specific command (`framer-ds data tracks`, `data encode-audio`) says on a task that
    keeps the base's hook: one line naming the tasks it serves (the base's default raises it)."""
    serving = ", ".join(tasks_serving(method)) or "none of the registered tasks"
    return ConfigError(
        [
            ConfigProblem(
                "task",
                f"`framer-ds {command}` serves the task(s) {serving}; this config's task is "
                f"{task.name!r}. Point it at a config of one of those tasks.",
            )
        ]
    )
