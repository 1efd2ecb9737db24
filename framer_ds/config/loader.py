"""YAML + dotted `key=value` overrides, and pydantic errors turned into problems that name the fix.

The task-aware step (which schema validates a mapping) lives next to the registry, in
`framer_ds.tasks.run_config`: this layer knows no task.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Tag, ValidationError

from framer_ds.config.errors import ConfigError, ConfigProblem, did_you_mean
from framer_ds.config.one_of import NO_GROUPS, OneOfGroups
from framer_ds.config.strict import section_model, section_models
from framer_ds.config.yaml_keys import RepeatedKeysError, UniqueKeyLoader


class ConfigYamlLoader(UniqueKeyLoader):
    """PyYAML reads YAML 1.1, whose floats need a dot: `1e-4` would be the STRING '1e-4' and only a lax
    schema would turn it into a number. Configs and overrides are read as YAML 1.2 reads that, so the
    schemas can refuse every value of the wrong type. A key set twice in one mapping is refused
    (`config/yaml_keys.py`): YAML would keep the second silently."""


ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=ConfigYamlLoader)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; errors name the file and the parser's position."""
    if not path.is_file():
        raise ConfigError([ConfigProblem(str(path), "file not found; check the path")], str(path))
    try:
        data = parse_yaml(path.read_text())
    except RepeatedKeysError as exc:
        raise ConfigError(exc.problems(str(path)), str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem(str(path), f"invalid YAML: {exc}")], str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [ConfigProblem(str(path), f"top level must be a mapping of keys, got {type(data).__name__}")],
            str(path),
        )
    return data


def output_dir_early(path: Path, overrides: Sequence[str]) -> Path | None:
    """`output_dir` from the YAML and its overrides alone, without importing the task or validating:
    where a stop signal during the seconds of imports before that writes preempted.json. None when it
    cannot be read this way; the full validation that follows says why."""
    from framer_ds.config.schema import expand_path

    try:
        raw = read_yaml_mapping(Path(path))
        if apply_overrides(raw, overrides) or not isinstance(raw.get("output_dir"), str):
            return None
        return expand_path(raw["output_dir"])
    except (ConfigError, ValueError):
        return None


def apply_overrides(
    raw: dict[str, Any], overrides: Sequence[str], one_of: OneOfGroups = NO_GROUPS
) -> list[ConfigProblem]:
    """Apply `a.b.c=value` overrides in place (values parsed as YAML: 20, 1e-4, null, [1, 2], true).

    An override that sets one member of a one-of group (`one_of`, found from the schema: a source's
    `path` or `builtin`, a cadence's unit, `data.stride` or `stride_range`) replaces the file's choice:
    `data.source.path=/my/videos` on `source: {builtin: synthetic_clips}` means that path, not "path and
    builtin both set". Among the overrides the later one wins, whether it sets the same key again or
    another member of the group (`COMMON... train.length.steps=4` after a `train.length.epochs=1`), as on
    any command line where a later flag replaces an earlier one.

    Not a one-of group: `overwrite_output_dir` and `train.resume`. `--overwrite` deletes the run that a
    resume would continue, so the pair stays refused wherever it is written (`RunConfigBase`)."""
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(
                ConfigProblem(item, "override must look like key.path=value, e.g. train.length.steps=20")
            )
            continue
        try:
            value = parse_yaml(text)
        except yaml.YAMLError as exc:
            problems.append(ConfigProblem(key, f"cannot parse override value {text!r}: {exc}"))
            continue
        member = one_of.member_chosen_by(key, value)
        problem = _set_dotted(raw, key, value)
        if problem is not None:
            problems.append(problem)
        elif member is not None:
            one_of.drop_rivals(raw, member)
    return problems


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> ConfigProblem | None:
    """`raw` with `value` at the dotted `key`, making the missing sections (a null section becomes one);
    a problem when a parent on the way holds a plain value."""
    node = raw
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            return ConfigProblem(key, f"'{where}' is a value, not a section; cannot set {key}")
        node = child
    node[parts[-1]] = value
    return None


def attribute_to_overrides(
    problems: Sequence[ConfigProblem], overrides: Sequence[str]
) -> list[ConfigProblem]:
    """Name the command-line override behind each problem it caused: a user who typed
    `train.optimizer.learning_rate=abc` looks for it on the command line, not in the YAML file."""
    keys = {item.partition("=")[0].strip(): item for item in overrides if "=" in item}
    attributed = []
    for problem in problems:
        item = next(
            (
                text
                for key, text in keys.items()
                if problem.where == key
                or problem.where.startswith(key + ".")
                or key.startswith(problem.where + ".")
            ),
            None,
        )
        message = problem.message if item is None else f"{problem.message} (in override {item})"
        attributed.append(ConfigProblem(problem.where, message))
    return attributed


def _union_tags(annotation: Any) -> dict[str, type[BaseModel]]:
    """{tag: member} of a tagged union (`Annotated[SvdBase, Tag("svd")] | ...`); {} for any other."""
    tags: dict[str, type[BaseModel]] = {}
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return tags
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Annotated:
            for item in typing.get_args(arg)[1:]:
                if isinstance(item, Tag) and isinstance(item.tag, str):
                    tags[item.tag] = section_models(arg)[0]
    return tags


def _config_keys(
    root: type[BaseModel], loc: Sequence[str | int]
) -> tuple[list[str | int], type[BaseModel] | None]:
    """The config keys of an error location and the section that owns a key after the last one. pydantic
    puts a tagged union's tag into the location (`model.base.framer.source`): it is no key, but it says
    which member's keys apply."""
    keys: list[str | int] = []
    model: type[BaseModel] | None = root
    tags: dict[str, type[BaseModel]] = {}
    for part in loc:
        if isinstance(part, str) and part in tags:
            model, tags = tags[part], {}
            continue
        keys.append(part)
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        model = section_model(field.annotation) if field is not None else None
        tags = _union_tags(field.annotation) if field is not None else {}
    return keys, model


def describe_validation_error(exc: ValidationError, schema: type[BaseModel]) -> list[ConfigProblem]:
    """Turn pydantic errors into problems that name the key path and the fix."""
    problems = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "union")))]
        # pydantic puts the member type of `X | None` into the location; keep only real keys.
        loc = [p for p in loc if not (isinstance(p, str) and p[:1].isupper())]
        keys, _ = _config_keys(schema, loc)
        where = ".".join(str(p) for p in keys) or "config"
        kind = err["type"]
        if kind == "extra_forbidden":
            _, owner = _config_keys(schema, loc[:-1])
            valid = sorted(owner.model_fields) if owner else []
            hint = did_you_mean(str(keys[-1]), valid)
            listing = f" Valid keys here: {', '.join(valid)}." if valid else ""
            message = f"unknown key.{hint} Remove it or fix the spelling.{listing}"
        elif kind == "missing":
            _, owner = _config_keys(schema, loc[:-1])
            field = owner.model_fields.get(str(keys[-1])) if owner else None
            about = f" ({field.description})" if field is not None and field.description else ""
            message = f"required key is missing; add it{about}."
        elif kind == "finite_number":
            message = (
                f"got {err.get('input')!r}: must be a finite number (a literal beyond float range such as "
                "1e400 reads as inf); write the value you mean."
            )
        elif isinstance(err.get("input"), dict):  # a section's own validator: the rule, not the section
            message = f"{err['msg'].removeprefix('Value error, ')}."
        else:
            message = f"got {err.get('input')!r}: {err['msg']}."
        problems.append(ConfigProblem(where, message))
    return problems


def dump_run_config(config: BaseModel) -> str:
    """The resolved config as YAML (what `output_dir/config.yaml` holds; loadable by load_run_config)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
