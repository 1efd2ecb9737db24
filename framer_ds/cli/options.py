"""Command-line flags made from a pydantic options model, so a task declares its command options once
(typed, validated, described) and the CLI stays the only place that parses a command line."""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from framer_ds.config.errors import ConfigError, ConfigProblem

Options = TypeVar("Options", bound=BaseModel)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _unwrap_optional(annotation: Any) -> Any:
    """`X | None` and `Annotated[X, ...]` -> X: the type the flag parses (pydantic validates the rest)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            annotation = members[0]
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _number_or_word(annotation: Any) -> dict[str, Any] | None:
    """`int | Literal["auto"]` (optionally `| None`): a flag that takes a number or one of the words,
    e.g. `--motion-bucket 90` or `--motion-bucket auto`; None for any other type."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    members = [a for a in typing.get_args(annotation) if a is not type(None)]
    words = [w for m in members if typing.get_origin(m) is Literal for w in typing.get_args(m)]
    numbers = [m for m in members if m in (int, float)]
    if len(numbers) != 1 or len(members) != 2 or not words:
        return None

    def parse(text: str) -> Any:
        return text if text in words else numbers[0](text)

    parse.__name__ = f"{numbers[0].__name__} or {'/'.join(map(str, words))}"  # argparse's error names it
    return {"type": parse, "metavar": f"{{N,{','.join(map(str, words))}}}"}


def _argument_kwargs(annotation: Any) -> dict[str, Any]:
    """argparse settings for one field type: lists take several values, fixed tuples that many, Literals
    become choices, a number-or-word union takes either."""
    either = _number_or_word(annotation)
    if either is not None:
        return either
    annotation = _unwrap_optional(annotation)
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is list:
        (item,) = typing.get_args(annotation)
        return {"nargs": "+", "type": _unwrap_optional(item)}
    if (
        origin is tuple
        and len(set(typing.get_args(annotation))) == 1
        and ... not in typing.get_args(annotation)
    ):
        items = typing.get_args(annotation)  # a fixed count of one type: `--step-range 0 0.5`
        metavar = ("LO", "HI") if len(items) == 2 else None
        return {"nargs": len(items), "type": items[0], "metavar": metavar}
    if origin is Literal:
        return {"choices": list(typing.get_args(annotation))}
    if annotation in (int, float, str, Path):
        return {"type": annotation}
    raise TypeError(f"internal: no command-line form for an option of type {annotation!r}")


def build_options_parser(model: type[BaseModel], prog: str, description: str) -> argparse.ArgumentParser:
    """One flag per field (`top_k` -> `--top-k`); help shows the description and the default. A field's
    `json_schema_extra={"old_flags": [...]}` keeps the flags it was renamed from working."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for name, field in model.model_fields.items():
        kwargs = _argument_kwargs(field.annotation)
        default = "" if field.is_required() else f" (default: {field.get_default(call_default_factory=True)})"
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        parser.add_argument(
            _flag(name),
            *extra.get("old_flags", ()),
            dest=name,
            default=None,  # unset flags fall back to the model's default, never argparse's
            required=field.is_required(),
            help=(field.description or "") + default,
            **kwargs,
        )
    return parser


def parse_options(model: type[Options], parser: argparse.ArgumentParser, argv: Sequence[str]) -> Options:
    """Parse and validate; every invalid value is reported at once, by its flag."""
    given = {k: v for k, v in vars(parser.parse_args(list(argv))).items() if v is not None}
    for name, value in given.items():  # argparse gives lists; strict models take tuples only as tuples
        if typing.get_origin(_unwrap_optional(model.model_fields[name].annotation)) is tuple:
            given[name] = tuple(value)
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        problems = [
            # a model validator's rule reads as the rule (as in config files), without pydantic's prefix
            ConfigProblem(
                _flag(str(err["loc"][0])) if err["loc"] else "options",
                err["msg"].removeprefix("Value error, "),
            )
            for err in exc.errors()
        ]
        raise ConfigError(problems, "command-line options") from None


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """CONFIG and its dotted overrides: every command that reads a training YAML takes them alike."""
    parser.add_argument("config", type=Path, help="training YAML (see configs/)")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. train.length.steps=20"
    )
