"""The config reference of every built-in task (docs/config.md, `framer-ds config show TASK`)."""

from __future__ import annotations

from framer_ds.config.reference import FieldReference, render_markdown_table, schema_reference
from framer_ds.config.renames import schema_renames
from framer_ds.config.schema import RunConfigBase
from framer_ds.tasks.registry import available_tasks, get_task_class

DOC_HEADER = """# Config reference

Generated from the schemas by `framer-ds config docs --write docs/config.md` (a test fails when this
file is stale). `framer-ds config show TASK` prints the same for one task in a terminal. Any key can
be overridden on the command line with a dotted path: `framer-ds train CONFIG train.length.steps=20
model.lora.rank=32`. Unknown keys are errors, with a "did you mean" suggestion.

Where a model or a data set comes from is a `source` section holding exactly one of `path`, `builtin`
(an asset generated in the cache: demos, tests) or, for a model built fresh, `config`. Such keys of
which a config sets one (a source's options, a cadence's unit, video_lora's `data.stride` or
`data.stride_range`) follow one rule: an override of one of them replaces the file's choice
(`data.source.path=/my/videos` on a config with `source: {builtin: ...}`), and of two among the
overrides the later wins. A key renamed
since an earlier version (each task's "Renamed keys" below) is an error naming its new key; a config
framer_ds recorded (a checkpoint's or an export's) is moved to the new keys silently.
"""


def builtin_task_names() -> list[str]:
    """Registered tasks that ship with framer_ds (a user's `imports:` tasks are not documented here)."""
    return [name for name in available_tasks() if get_task_class(name).__module__.startswith("framer_ds.")]


def task_reference(task: str) -> list[FieldReference]:
    """Every key of one task's run config: the shared keys, then `model.*` and `data.*`."""
    return schema_reference(get_task_class(task).config_class())


def _renames_table(renames: dict[str, str]) -> list[str]:
    """The "Renamed keys" table of a section of the reference (nothing when no key was renamed)."""
    if not renames:
        return []
    rows = [f"| `{old}` | `{new}` |" for old, new in renames.items()]
    return ["\n".join(["Renamed keys:\n", "| was | now |", "| --- | --- |", *rows]) + "\n"]


def config_docs_markdown() -> str:
    shared = schema_reference(RunConfigBase)
    shared_renames = schema_renames(RunConfigBase)
    parts = [DOC_HEADER, "## Every task\n", render_markdown_table(shared), *_renames_table(shared_renames)]
    shared_keys = {row.key for row in shared}
    for name in builtin_task_names():
        task = get_task_class(name)
        own = [row for row in task_reference(name) if row.key not in shared_keys]
        parts += [f"## `task: {name}`\n", f"{task.summary}\n", render_markdown_table(own)]
        renames = schema_renames(task.config_class())
        parts += _renames_table({old: new for old, new in renames.items() if old not in shared_renames})
    return "\n".join(parts)
