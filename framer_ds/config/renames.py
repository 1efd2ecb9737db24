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

Two shapes beyond a plain move: a key may become a section of its own (`model.base: framer` ->
`model.base.name`; the old key is the one holding a plain value, not the new section), and a section whose
every key moved elsewhere (`model.framer.*` -> `model.base.*`) is gone: left empty or null (as recorded
configs hold it) it is dropped, having nothing left to lose (a top-level section never retires).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pydantic import BaseModel

from framer_ds.config.errors import ConfigProblem
from framer_ds.config.one_of import NO_GROUPS, OneOfGroups, chooses
from framer_ds.config.strict import section_models


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


def _old_key_in(parent: dict[str, Any] | None, key: str, old: str, new: str) -> bool:
    """Whether `parent` holds the old key `old`: a key that became its own section (`base` -> `base.name`)
    is old only while it holds a plain value, not the new section."""
    if parent is None or key not in parent:
        return False
    return not (new.startswith(f"{old}.") and isinstance(parent[key], dict))


def _drop_retired_sections(tree: dict[str, Any], renames: dict[str, str]) -> None:
    """Remove, in place, each section all of whose keys were renamed elsewhere (the parent of old keys
    that no new key lives under) where it is left empty or null. A top-level section (`train`, `data`)
    is one of the run's own and never retires."""
    parents = {old.rsplit(".", 1)[0] for old in renames if old.count(".") >= 2}  # the run's own sections stay
    for section in sorted(parents):
        if any(new == section or new.startswith(f"{section}.") for new in renames.values()):
            continue
        parent, key = _lookup(tree, section)
        if parent is not None and key in parent and parent[key] in (None, {}):
            del parent[key]


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
        if _old_key_in(parent, key, old, new):
            where, value = _what_to_write(old, new, parent[key], schema)
            problems.append(
                ConfigProblem(old, f"was renamed to {new}; write `{where}: {_as_yaml(value)}` instead")
            )
    return problems


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


def move_renamed_keys(
    raw: dict[str, Any], renames: dict[str, str], one_of: OneOfGroups = NO_GROUPS
) -> dict[str, Any]:
    """A copy of a config with every old key's value moved to its new key (an explicit new key wins):
    what an older framer_ds recorded reads as this version's config, and a user's old key is validated
    where it lives now (besides being reported by `renamed_key_problems`).

    `one_of` (a user's config: the schema's one-of groups): an old key moves into a member of a group only
    while the group holds no choice, and a null old value does not move, so `max_steps: 5` beside `length:
    {epochs: 2}`, or an old `max_steps` + `epochs` pair, reads as the old code read it (the first one set
    wins) instead of adding "set exactly one" to the "renamed to" lines."""
    moved = copy.deepcopy(raw)
    for old, new in renames.items():
        parent, key = _lookup(moved, old)
        if not _old_key_in(parent, key, old, new):
            continue
        value = parent.pop(key)
        if one_of.rivals(new) and not chooses(value):
            continue  # a null old unit chooses nothing; moved, it would leave its group with no choice
        member = one_of.member_chosen_by(new, value)
        if member is not None and one_of.choice_in(moved, member) is not None:
            continue  # the group holds a choice already: the first one set wins, as the old code read it
        _put(moved, new, value)
    _drop_retired_sections(moved, renames)
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
