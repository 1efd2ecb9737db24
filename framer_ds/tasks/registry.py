"""`@register_task` and lookup with "did you mean" suggestions; the commands tasks contribute to the CLI.

Light on purpose: every `framer-ds` process imports it to build its parser, so it imports no task and
not `tasks.base` (torch) at run time."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from framer_ds.config.errors import ConfigError, ConfigProblem, did_you_mean

if TYPE_CHECKING:
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

# The built-in tasks that contribute commands, and the module that declares them (a `COMMANDS` tuple of
# `TaskCommand`). These modules import nothing heavy: the parser of every `framer-ds` process reads them,
# and a command's `run` receives the task built from the config, whose module only then is imported.
BUILTIN_TASK_COMMANDS: dict[str, str] = {
    "video_lora": "framer_ds.tasks.video_lora.commands",
    "tts_lm": "framer_ds.tasks.tts_lm.commands",
}

# How a task of an installed package contributes commands: an entry point in this group, named after the
# task, whose value is its commands module (in its pyproject.toml:
# `[project.entry-points."framer_ds.task_commands"]` then `my_task = "my_package.commands"`). The parser is
# built before any config is read, so a module named only in a config's `imports:` cannot add commands.
TASK_COMMANDS_GROUP = "framer_ds.task_commands"


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


@dataclass(frozen=True)
class TaskCommand:
    """`framer-ds data NAME CONFIG [key=value ...]`, contributed by a task: the CLI loads CONFIG, refuses
    it in one line when its task does not declare NAME, builds the task, runs its `check()`, then prints
    what `run(task, shard)` returns. `shard` is this process's (index, count) among those a launcher
    started (else (0, 1)), for a command that splits its work between them."""

    name: str
    help: str
    run: Callable[[Task, tuple[int, int]], str]


def task_commands() -> dict[str, dict[str, TaskCommand]]:
    """Command name -> {task name: its declaration}, by command name: what `framer-ds data` offers
    beside `check`. Imports the command modules of the built-in tasks and of those installed packages
    declare (`TASK_COMMANDS_GROUP`), never the tasks themselves."""
    modules = dict(BUILTIN_TASK_COMMANDS)
    for entry in entry_points(group=TASK_COMMANDS_GROUP):
        modules.setdefault(entry.name, entry.module)  # a built-in task's own commands come first
    table: dict[str, dict[str, TaskCommand]] = {}
    for task, module in modules.items():
        for command in importlib.import_module(module).COMMANDS:
            table.setdefault(command.name, {})[task] = command
    return dict(sorted(table.items()))


def task_command(name: str, task: str) -> TaskCommand:
    """The declaration of command `name` for `task`, or one line naming the tasks the command serves."""
    serving = task_commands().get(name, {})
    if task in serving:
        return serving[task]
    tasks = ", ".join(sorted(serving)) or "none of the registered tasks"
    problem = ConfigProblem(
        "task",
        f"`framer-ds data {name}` serves the task(s) {tasks}; this config's task is {task!r}. "
        "Point it at a config of one of those tasks.",
    )
    raise ConfigError([problem])
