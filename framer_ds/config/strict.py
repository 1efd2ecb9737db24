"""The base every config section derives from: strict types, unknown keys refused, paths expanded; and
which annotations hold a section (`section_models`), the walk every schema-wide table makes.

It has its own module so that the sections of `train:` (framer_ds.config.train_config), the shared
`Cadence` type and the task sections can all derive from it while `schema.py` assembles them.
"""

from __future__ import annotations

import os
import re
import types
import typing
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

_UNSET_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_path(text: str) -> Path:
    """`~` and `$VARS` expanded, as a shell would; an unset variable is an error, not a literal `$X`
    directory (a literal `~` directory was what `output_dir: ~/runs/x` used to create)."""
    expanded = os.path.expandvars(os.path.expanduser(text))
    unset = _UNSET_VARIABLE.search(expanded)
    if unset:
        name = unset.group(1).strip("{}")
        raise ValueError(
            f"environment variable {name} in {text!r} is not set; export it or write the path out"
        )
    return Path(expanded)


def _from_config_text(annotation: Any, value: Any) -> Any:
    """The two conversions a strict schema still needs from YAML/JSON text: a string to a `Path`
    (expanded) and a list to a `tuple`, wherever the annotation has them (inside `| None`, lists)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            converted = _from_config_text(member, value)
            if converted is not value:
                return converted
        return value
    if annotation is Path and isinstance(value, str):
        return expand_path(value)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(annotation) or (Any,)
        return [_from_config_text(item, v) for v in value]
    if origin is tuple and isinstance(value, list):
        items = typing.get_args(annotation)
        if len(items) == len(value):
            return tuple(_from_config_text(a, v) for a, v in zip(items, value, strict=True))
    return value


def section_models(annotation: Any) -> list[type[BaseModel]]:
    """Every pydantic model an annotation can hold: `WandbConfig | None` one, a union of sections (the
    bases of `model.base`) each member. A `list[X]` is not a section: its items have no fixed path."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return section_models(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [model for arg in typing.get_args(annotation) for model in section_models(arg)]
    return []


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `WandbConfig | None`, if any (a union of
    sections: its first member)."""
    found = section_models(annotation)
    return found[0] if found else None


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated, and types are
    strict: `micro_batch_size: true` or `2.5` is an error, never silently 1 or 2. Paths are the one
    conversion from text (with `~` and `$VARS` expanded), lists become tuples where a tuple is declared.

    No float field takes NaN or inf (`allow_inf_nan=False`, one rule for every section of every task):
    `optimizer.epsilon: 1e400` reads as inf, passed `gt=0`, and trained nothing with exit 0. A field that
    means something by inf must say so in its description and opt in with `Field(allow_inf_nan=True)`."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        protected_namespaces=(),
        strict=True,
        allow_inf_nan=False,
    )
    # Keys this section used to have, {old: new}, both relative to the section (the new one may be
    # dotted, into a subsection): an old config gets "renamed to ..." (framer_ds.config.renames).
    renamed_keys: ClassVar[dict[str, str]] = {}
    # Groups of keys of which a config sets one (`path` or `builtin`; a cadence's unit), relative to this
    # section (a member may be dotted, into a subsection). Declared here, they are what an override
    # replaces: setting one member on the command line drops the file's choice (framer_ds.config.one_of).
    one_of: ClassVar[tuple[tuple[str, ...], ...]] = ()

    @field_validator("*", mode="before")
    @classmethod
    def _paths_and_tuples_from_text(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name) if info.field_name else None
        return value if field is None else _from_config_text(field.annotation, value)

    @classmethod
    def migrate_recorded(cls, section: Any) -> Any:
        """This section's value in a config framer_ds recorded, once its renamed keys were moved and its
        subsections migrated: the hook for a migration that is not a pure move (a `Cadence` keeps the
        one unit an older version meant out of the several it wrote). The default keeps the value."""
        return section
