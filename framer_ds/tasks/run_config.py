"""A YAML (plus overrides), or the config recorded in an export, validated against the schema of the
task it names: the one way a run config is made. It sits next to the registry because only the
registry knows which schema a task has.

Every problem (YAML syntax, malformed override, unknown task, unknown key, wrong type) is collected
and raised together as one `ConfigError`, each naming the key path and the fix.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from framer_ds import __version__
from framer_ds.config.errors import ConfigError, ConfigProblem, did_you_mean
from framer_ds.config.loader import (
    apply_overrides,
    attribute_to_overrides,
    describe_validation_error,
    read_yaml_mapping,
)
from framer_ds.config.one_of import one_of_groups
from framer_ds.config.renames import (
    migrate_recorded,
    move_renamed_keys,
    renamed_key_problems,
    schema_renames,
)
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.export import EXPORT_RECORD, read_export_record
from framer_ds.tasks.base import Task
from framer_ds.tasks.registry import available_tasks, get_task_class, is_registered, unknown_task_problem


def import_task_modules(modules: Sequence[str]) -> list[ConfigProblem]:
    """Import user modules named in `imports:` (they register tasks as a side effect)."""
    problems = []
    for index, module in enumerate(modules):
        try:
            importlib.import_module(str(module))
        except Exception as exc:  # any import failure is a config problem the user must fix
            problems.append(
                ConfigProblem(
                    f"imports.{index}",
                    f"cannot import {module!r} ({type(exc).__name__}: {exc}); check the module name "
                    "and that its directory is on PYTHONPATH",
                )
            )
    return problems


def _schema_of(raw: dict[str, Any]) -> tuple[type[BaseModel], list[ConfigProblem]]:
    """The schema of the task `raw` names (after importing its `imports:`), or the shared base with
    the problem that it names none or an unknown one."""
    problems = import_task_modules(raw.get("imports") or [])
    task_name = raw.get("task")
    if task_name is None:
        problems.append(
            ConfigProblem(
                "task", f"required key is missing; set it to one of: {', '.join(available_tasks())}."
            )
        )
    elif not isinstance(task_name, str) or not is_registered(task_name):
        problems.append(unknown_task_problem(str(task_name)))
    else:
        return get_task_class(task_name).config_class(), problems
    return RunConfigBase, problems


def validate_run_config(raw: dict[str, Any], source: str = "config", recorded: bool = False) -> RunConfigBase:
    """Validate a raw mapping against the schema of the task it names; raise all problems at once.

    A key renamed since is an error naming the new key in a config a user wrote; in a config framer_ds
    `recorded` (a checkpoint's or an export's) it is moved to its new name, so old runs stay usable."""
    schema, problems = _schema_of(raw)
    renames = schema_renames(schema)
    if recorded:
        raw = migrate_recorded(raw, schema)
    else:
        problems += renamed_key_problems(raw, renames, schema)
        # Validated at their new place: an old key is reported once, as renamed, and neither as unknown
        # nor as its new section missing (`model.source` when `pretrained_model_name_or_path` is set).
        # Only moved: the sections' migrations of recorded configs would hide a user's real conflict.
        raw = move_renamed_keys(raw, renames, one_of=one_of_groups(schema))
    candidate = (
        raw if schema is not RunConfigBase else {k: v for k, v in raw.items() if k not in ("model", "data")}
    )
    try:
        config = schema.model_validate(candidate)
    except ValidationError as exc:
        problems += describe_validation_error(exc, schema)
    if problems:
        raise ConfigError(problems, source)
    return config


def load_run_config(path: Path | str, overrides: Sequence[str] = ()) -> RunConfigBase:
    """Read, override, validate (all problems at once). An override of one member of a one-of group
    replaces the file's choice (`data.source.path=DIR` on `source: {builtin: ...}`, `train.length.steps=4`
    on `length: {epochs: 3}`): the groups come from the schema of the task the overrides leave named."""
    path = Path(path)
    raw = read_yaml_mapping(path)
    trial = copy.deepcopy(raw)
    apply_overrides(trial, overrides)  # only to learn the task, and so the schema, they leave named
    problems = apply_overrides(raw, overrides, one_of=one_of_groups(_schema_of(trial)[0]))
    try:
        config = validate_run_config(raw, str(path))
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError(attribute_to_overrides(problems, overrides), str(path)) from None
    return config


def resolved_value(config: RunConfigBase, dotted_key: str) -> str:
    """One value of a validated config as a shell script reads it: paths and scalars as text, sections
    and lists as JSON. An unknown key gets the schema's "did you mean". A renamed key (a script
    written for an older version) is told the new name."""
    renamed = schema_renames(type(config)).get(dotted_key)
    if renamed is not None:
        problem = ConfigProblem(dotted_key, f"was renamed to {renamed}; ask for that key instead")
        raise ConfigError([problem], "config get")
    value: Any = config
    for depth, part in enumerate(dotted_key.split(".")):
        fields = type(value).model_fields if isinstance(value, BaseModel) else {}
        if part not in fields:
            where = ".".join(dotted_key.split(".")[: depth + 1])
            if not fields:
                message = f"{where.rsplit('.', 1)[0]} is a value, not a section"
            else:
                message = "is not a config key." + (
                    did_you_mean(part, list(fields)) or f" (keys: {', '.join(fields)})"
                )
            raise ConfigError([ConfigProblem(where, message)], "config get")
        value = getattr(value, part)
    if isinstance(value, BaseModel):
        return value.model_dump_json(indent=2)
    if isinstance(value, list | dict):
        import json

        return json.dumps(value, default=str)
    return str(value)


def load_exported_task(export_dir: Path) -> Task:
    """The task that wrote `export_dir`, rebuilt from the resolved config recorded in it, so that a
    sampler preprocesses exactly as training did. Loads no weights."""
    record = read_export_record(export_dir)
    try:
        config = validate_run_config(record["config"], f"{export_dir}/{EXPORT_RECORD}", recorded=True)
    except ConfigError as exc:
        version = record.get("framer_ds_version", "?")
        stale = ConfigProblem(
            str(export_dir),
            f"the config recorded by framer_ds {version} no longer validates with this version "
            f"({__version__}); sample with the version that trained it",
        )
        raise ConfigError([*exc.problems, stale], exc.source) from None
    return get_task_class(config.task)(config)
