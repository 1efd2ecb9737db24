"""The config reference of every built-in task (docs/config.md, `framer-ds config show TASK`)."""

from __future__ import annotations

from framer_ds.config.reference import FieldReference, render_markdown_table, schema_reference
from framer_ds.config.schema import RunConfigBase
from framer_ds.tasks.registry import available_tasks, get_task_class

DOC_HEADER = """# Config reference

Generated from the schemas by `framer-ds config docs --write docs/config.md` (a test fails when this
file is stale). `framer-ds config show TASK` prints the same for one task in a terminal. Any key can
be overridden on the command line with a dotted path: `framer-ds train CONFIG train.length.steps=20
model.lora.rank=32`. Unknown keys are errors, with a "did you mean" suggestion.
"""


def builtin_task_names() -> list[str]:
    """Registered tasks that ship with framer_ds (a user's `imports:` tasks are not documented here)."""
    return [name for name in available_tasks() if get_task_class(name).__module__.startswith("framer_ds.")]


def task_reference(task: str) -> list[FieldReference]:
    """Every key of one task's run config: the shared keys, then `model.*` and `data.*`."""
    return schema_reference(get_task_class(task).config_class())


def config_docs_markdown() -> str:
    shared = schema_reference(RunConfigBase)
    parts = [DOC_HEADER, "## Every task\n", render_markdown_table(shared)]
    shared_keys = {row.key for row in shared}
    for name in builtin_task_names():
        task = get_task_class(name)
        own = [row for row in task_reference(name) if row.key not in shared_keys]
        parts += [f"## `task: {name}`\n", f"{task.summary}\n", render_markdown_table(own)]
    return "\n".join(parts)
