"""Where a model or a data set comes from: exactly one of a local `path`, a `builtin` (generated in the
cache: demos, tests) or, for a model built fresh, a transformers `config`.

Why one type: seven sections had their own "set exactly one of ..." validator, each with its own key
names (`pretrained_model_name_or_path`, `root`, `train`) and its own message. Each use now declares a
subclass that says what its `path` holds and narrows `builtin` to its names (a `Literal`); the rule and
its message live here, and every task reads `<section>.source.path` / `.builtin` alike.

A random init from a transformers config dict (tts_lm, vit_classification) is a third option of its
use's Source, `config`, rather than a builtin: it is a choice of where the weights come from (nowhere:
built from these fields) exclusive with the other two, and a builtin names a fixed generated asset,
not a free mapping of architecture fields.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from framer_ds.config.schema import StrictModel


class Source(StrictModel):
    """Exactly one of this section's options is set. Subclasses redeclare `path` with what it holds and
    add `builtin: Literal[...] | None` (and `config`) as their use needs."""

    path: Path | None = Field(None, description="A local directory or file.")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """A source's options are one one-of group, whatever options its use declares (`path`, `builtin`,
        `config`): `data.source.path=DIR` on a config with a builtin replaces it (framer_ds.config.one_of)."""
        super().__pydantic_init_subclass__(**kwargs)
        cls.one_of = (tuple(cls.model_fields),)

    @model_validator(mode="before")
    @classmethod
    def _empty_config_beside_another_option(cls, data: Any) -> Any:
        """Beside another option an empty `config: {}` is no choice: before `source` existed a model
        section always held `config: {}` for "no config", and the configs framer_ds recorded then
        (checkpoints, exports) move here unchanged. Alone, `{}` is a fresh model of the defaults."""
        others = data.items() if isinstance(data, dict) and data.get("config") == {} else ()
        if any(value is not None for key, value in others if key != "config"):
            return {key: value for key, value in data.items() if key != "config"}
        return data

    def chosen(self) -> list[str]:
        """The options this source sets (a field counts when it is not null)."""
        return [name for name in type(self).model_fields if getattr(self, name) is not None]

    @classmethod
    def builtin_names(cls) -> tuple[str, ...]:
        """The names `builtin` accepts here (none where this use has no builtin)."""
        field = cls.model_fields.get("builtin")
        if field is None:
            return ()
        return tuple(
            name
            for member in typing.get_args(field.annotation)
            for name in typing.get_args(member)
            if isinstance(name, str)
        )

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        chosen = self.chosen()
        if len(chosen) != 1:
            names = self.builtin_names()
            options = [
                f"builtin ({', '.join(names)})" if o == "builtin" else o for o in type(self).model_fields
            ]
            got = " and ".join(chosen) or "none"
            raise ValueError(f"set exactly one of {', '.join(options[:-1])} or {options[-1]}; got {got}")
        return self
