"""One-of groups: keys of which a config sets one (a source's `path` or `builtin`, a cadence's unit,
`data.stride` or `data.stride_range`), and the one rule a later value follows for them.

Why: a user pointing a shipped recipe at their own data types `data.source.path=/my/videos` on a config
saying `source: {builtin: synthetic_clips}`. Read key by key, that was "path and builtin both set" and
refused, while `train.length.steps=20` replaced a cadence in epochs by a rule of the cadences' own. Now
each section declares its groups beside its fields (`StrictModel.one_of`; a `Source` declares all its
options as one), `one_of_groups` collects them over a schema, and one rule serves every group: a value
that sets one member replaces the choice already made (the group's other members are dropped), in
command-line overrides (`loader.apply_overrides`) as in a renamed key moved to its new place
(`renames.move_renamed_keys`, which moves a value only into a group that holds no choice yet).

A member is chosen by any value but null and false (false: a switch such as `overwrite_output_dir`), or
by a key inside it (`model.source.config.hidden_size=64` chooses `config`). A member the schema's default
chooses (`data.stride: 1`) is set to null (a switch: false) when another is chosen, so that a default
never makes the pair a user did not write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from framer_ds.config.strict import section_model, section_models


def chooses(value: Any) -> bool:
    """Whether a member's value makes it the group's choice (null and false say "not this one")."""
    return value is not None and value is not False


@dataclass(frozen=True)
class OneOfGroups:
    """Every one-of group of a schema, each as the dotted paths of its members from the root."""

    groups: tuple[tuple[str, ...], ...] = ()
    # member -> the value that unsets it, for members the schema's default would choose (`data.stride`).
    unset_values: dict[str, Any] = field(default_factory=dict)

    def member_chosen_by(self, key: str, value: Any) -> str | None:
        """The member a `key=value` chooses: `key` is the member set to a value that chooses, or lies
        inside the member (a section such as `model.source.config`); None for any other key."""
        for group in self.groups:
            for member in group:
                if key.startswith(f"{member}.") or (key == member and chooses(value)):
                    return member
        return None

    def rivals(self, member: str | None) -> list[str]:
        """The other members of every group `member` belongs to ([] for None)."""
        return [other for group in self.groups if member in group for other in group if other != member]

    def drop_rivals(self, raw: dict[str, Any], member: str) -> None:
        """Drop, in place, the choice `raw` made in `member`'s groups: each other member is removed,
        or set to its unset value where the schema's default would choose it."""
        for rival in self.rivals(member):
            parent, key = _parent(raw, rival, make=rival in self.unset_values)
            if parent is None:
                continue
            parent.pop(key, None)
            if rival in self.unset_values:
                parent[key] = self.unset_values[rival]

    def choice_in(self, raw: dict[str, Any], member: str) -> str | None:
        """The other member of `member`'s groups that `raw` chooses, if any."""
        for rival in self.rivals(member):
            parent, key = _parent(raw, rival, make=False)
            if parent is not None and chooses(parent.get(key)):
                return rival
        return None


NO_GROUPS = OneOfGroups()


def _parent(raw: dict[str, Any], dotted: str, make: bool) -> tuple[dict[str, Any] | None, str]:
    """The mapping that holds `dotted`'s last key, and that key: None where a parent is missing or a plain
    value, unless `make` (then missing or null parents become sections)."""
    *parents, last = dotted.split(".")
    node: Any = raw
    for part in parents:
        child = node.get(part)
        if child is None and make:
            child = node[part] = {}
        if not isinstance(child, dict):
            return None, last
        node = child
    return node, last


def _default(model: type[BaseModel], dotted: str) -> Any:
    """The schema's default of a (dotted) key of `model`; PydanticUndefined where it has none."""
    *parents, last = dotted.split(".")
    for part in parents:
        section = section_model(model.model_fields[part].annotation)
        if section is None:
            return PydanticUndefined
        model = section
    return model.model_fields[last].get_default(call_default_factory=True)


def one_of_groups(schema: type[BaseModel]) -> OneOfGroups:
    """Every section's declared `one_of` groups over the whole schema (each member of a union of
    sections included: the bases of `model.base`), as dotted paths from the root."""
    groups: dict[tuple[str, ...], None] = {}  # ordered and without repeats (two bases, one path)
    unset: dict[str, Any] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for group in getattr(model, "one_of", ()):
            groups[tuple(f"{prefix}{member}" for member in group)] = None
            for member in group:
                default = _default(model, member)
                if default is not PydanticUndefined and chooses(default):
                    unset[f"{prefix}{member}"] = False if isinstance(default, bool) else None
        for name, info in model.model_fields.items():
            for section in section_models(info.annotation):
                walk(section, f"{prefix}{name}.")

    walk(schema, "")
    return OneOfGroups(tuple(groups), unset)
