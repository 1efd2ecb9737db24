"""Every config key with its type, default, limits and description, read from the schemas themselves,
so `docs/config.md` and `framer-ds config show TASK` cannot drift from what the loader accepts."""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen, MultipleOf
from pydantic import BaseModel

from framer_ds.config.strict import section_models


@dataclass(frozen=True)
class FieldReference:
    """One key (`train.optimizer.learning_rate`): type, default ('required' when it has none), limits,
    description."""

    key: str
    type: str
    default: str
    limits: str
    description: str
    is_section: bool


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is Literal:
        return " | ".join(repr(v) for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    if annotation is Path:
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(repr(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


_LIMITS = ((Ge, ">= {}", "ge"), (Gt, "> {}", "gt"), (Le, "<= {}", "le"), (Lt, "< {}", "lt"))


def _limits(metadata: list[Any]) -> str:
    found = []
    for item in metadata:
        for kind, text, attr in _LIMITS:
            if isinstance(item, kind):
                found.append(text.format(getattr(item, attr)))
        if isinstance(item, MultipleOf):
            found.append(f"multiple of {item.multiple_of}")
        if isinstance(item, MinLen):
            found.append(f"at least {item.min_length} item(s)")
        if isinstance(item, MaxLen):
            found.append(f"at most {item.max_length} item(s)")
    return ", ".join(found)


def _default(field: Any, section: type[BaseModel] | None) -> str:
    if field.is_required():
        return "required"
    if field.default is None:
        return "null"
    if section is not None:
        return "(section)"  # its keys follow; building it may need keys the user must set
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Path):
        return str(value)
    return repr(value) if isinstance(value, str) else str(value)


def schema_reference(model: type[BaseModel], prefix: str = "") -> list[FieldReference]:
    """Depth-first: each key, then the keys of its section (a `X | None` section is walked as X; a union
    of sections, such as video_lora's `model.base`, as each member in turn, a key they share once)."""
    rows: list[FieldReference] = []
    for name, field in model.model_fields.items():
        sections = section_models(field.annotation)
        section = sections[0] if sections else None
        rows.append(
            FieldReference(
                key=f"{prefix}{name}",
                type=_type_name(field.annotation),
                default=_default(field, section),
                limits=_limits(field.metadata),
                description=" ".join((field.description or "").split()),
                is_section=section is not None,
            )
        )
        for member in sections:
            seen = {row.key for row in rows}
            rows += [row for row in schema_reference(member, f"{prefix}{name}.") if row.key not in seen]
    return rows


def render_markdown_table(rows: list[FieldReference]) -> str:
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for row in rows:
        limits = f" ({row.limits})" if row.limits else ""
        description = row.description.replace("|", "\\|")
        cell_type = row.type.replace("|", "\\|")
        lines.append(f"| `{row.key}` | {cell_type}{limits} | `{row.default}` | {description} |")
    return "\n".join(lines) + "\n"


def render_text(rows: list[FieldReference]) -> str:
    """For a terminal: one key a line, then its description indented."""
    out = []
    for row in rows:
        limits = f", {row.limits}" if row.limits else ""
        out.append(f"{row.key}: {row.type} = {row.default}{limits}")
        if row.description:
            out.append(f"    {row.description}")
    return "\n".join(out) + "\n"
