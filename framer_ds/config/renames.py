"""Renamed config keys: an error naming the new key for a config a user writes, a silent move for a
config framer_ds itself recorded (a checkpoint's or an export's config.yaml from an older version).

Why: when a key is renamed (`train.max_steps` -> `train.length.steps`), an old YAML must not read as
"unknown key" with a list of valid ones to guess from: it must say what the key is called now. A run
directory written before the rename must still resume, evaluate and sample, so the configs framer_ds
wrote are migrated by the same table instead of a second copy of it.

Each config section declares its own renames next to its fields, relative to itself:

    class TrainConfig(StrictModel):
        renamed_keys: ClassVar[dict[str, str]] = {"max_steps": "length.steps"}

`schema_renames(schema)` collects them over the whole schema as dotted paths from the root. What is not a
pure move (two keys that became one value, such as `max_steps` + `epochs` -> `length`) is the new
section's `migrate_recorded` hook, run after the moves on a recorded config (`migrate_recorded` here) and
on the one key a user's "renamed to" line shows.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from typing import Any

from pydantic import BaseModel

from framer_ds.config.errors import ConfigProblem


def section_models(annotation: Any) -> list[type[BaseModel]]:
    """Every pydantic model an annotation can hold (`X | None`, a union of sections, `list[X]` is not a
    section: its items have no fixed path)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return section_models(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [model for arg in typing.get_args(annotation) for model in section_models(arg)]
    return []


def schema_renames(schema: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """{old dotted key: new dotted key} over the whole schema, from each section's `renamed_keys`."""
    renames = {f"{prefix}{old}": f"{prefix}{new}" for old, new in getattr(schema, "renamed_keys", {}).items()}
    for name, field in schema.model_fields.items():
        for section in section_models(field.annotation):
            renames.update(schema_renames(section, f"{prefix}{name}."))
    return renames


def _lookup(tree: dict[str, Any], dotted: str) -> tuple[dict[str, Any] | None, str]:
    """The mapping that would hold `dotted`'s last key (None where a parent is missing or not a
    mapping) and that key."""
    *parents, last = dotted.split(".")
    node: Any = tree
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None, last
    return (node if isinstance(node, dict) else None), last


def _as_yaml(value: Any) -> str:
    """A value as the user writes it in YAML (`null`, `true`, `'cosine'`), not as Python prints it."""
    if value is None or isinstance(value, bool | list | dict):
        return json.dumps(value)
    return repr(value)


def _what_to_write(old: str, new: str, value: Any, schema: type[BaseModel] | None) -> tuple[str, Any]:
    """The key and value the old one becomes, found by migrating it alone as a recorded config is: a
    pair's unused half (`eval_every: null`) becomes `eval.every: null`, not `eval.every.steps: null`."""
    if schema is None:
        return new, value
    tree = migrate_recorded(_put({}, old, value), schema)
    node, path = tree, []
    for part in new.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
        path.append(part)
    return (".".join(path), node) if path else (new, value)


def renamed_key_problems(
    raw: dict[str, Any], renames: dict[str, str], schema: type[BaseModel] | None = None
) -> list[ConfigProblem]:
    """One problem per old key present in a user's config, naming the key (and, given the `schema`, the
    value after any migration its section makes) to write instead."""
    problems = []
    for old, new in renames.items():
        parent, key = _lookup(raw, old)
        if parent is not None and key in parent:
            where, value = _what_to_write(old, new, parent[key], schema)
            problems.append(
                ConfigProblem(old, f"was renamed to {new}; write `{where}: {_as_yaml(value)}` instead")
            )
    return problems


def without_renamed_keys(raw: dict[str, Any], renames: dict[str, str]) -> dict[str, Any]:
    """A copy of `raw` without the old keys, so that validation does not report them a second time as
    unknown keys."""
    stripped = copy.deepcopy(raw)
    for old in renames:
        parent, key = _lookup(stripped, old)
        if parent is not None:
            parent.pop(key, None)
    return stripped


def _put(tree: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """`tree` with `value` at `dotted` unless a value is there already, making the missing sections."""
    node = tree
    *parents, last = dotted.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node.setdefault(last, value)
    return tree


def move_renamed_keys(raw: dict[str, Any], renames: dict[str, str]) -> dict[str, Any]:
    """A copy of a recorded config with every old key's value moved to its new key (an explicit new key
    wins): what an older framer_ds wrote reads as this version's config."""
    moved = copy.deepcopy(raw)
    for old, new in renames.items():
        parent, key = _lookup(moved, old)
        if parent is not None and key in parent:
            _put(moved, new, parent.pop(key))
    return moved


def _run_migration_hooks(tree: Any, schema: type[BaseModel]) -> Any:
    """Each section's `migrate_recorded` over the part of `tree` it holds, innermost sections first."""
    if isinstance(tree, dict):
        tree = dict(tree)
        for name, field in schema.model_fields.items():
            sections = section_models(field.annotation)
            if name in tree and sections:
                tree[name] = _run_migration_hooks(tree[name], sections[0])
    hook = getattr(schema, "migrate_recorded", None)
    return tree if hook is None else hook(tree)


def migrate_recorded(raw: dict[str, Any], schema: type[BaseModel]) -> dict[str, Any]:
    """A config framer_ds recorded (a checkpoint's, an export's), read as this version's: renamed keys
    moved, then the sections' own migrations for what is not a pure move (see
    `StrictModel.migrate_recorded`)."""
    return _run_migration_hooks(move_renamed_keys(raw, schema_renames(schema)), schema)
