"""Reading the launch configs (an accelerate YAML, a DeepSpeed JSON) into mappings for the pre-flight rules.

Why its own module: the accelerate YAML rules, the DeepSpeed JSON rules, the pre-flight that combines
them and `launch.environment` all read these files and report where a problem sits the same way; a
missing file or a syntax error becomes a problem naming the file, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from framer_ds.config.errors import ConfigProblem
from framer_ds.config.yaml_keys import RepeatedKeysError, UniqueKeyLoader

Problems = list[ConfigProblem]
Cfg = Mapping[str, Any]


def problem_at(src: str, key: str, message: str) -> ConfigProblem:
    """A problem at `key` of the file `src` (the file alone when `key` is empty)."""
    return ConfigProblem(f"{src}: {key}" if key else src, message)


def _load(path: Path, kind: str) -> tuple[dict[str, Any] | None, Problems]:
    """Read a JSON/YAML mapping; a missing file or syntax error becomes a problem, not a traceback."""
    where = str(path)
    if not path.is_file():
        return None, [problem_at(where, "", "file not found; check the path (relative to where you launch)")]
    try:
        text = path.read_text()
        # accelerate reads its YAML with yaml.safe_load, which keeps a repeated key's last value silently
        data = json.loads(text) if kind == "JSON" else (yaml.load(text, Loader=UniqueKeyLoader) or {})
    except RepeatedKeysError as exc:
        return None, [problem_at(where, r.key, r.describe()) for r in exc.repeats]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        hint = " (JSON allows no comments or trailing commas)" if kind == "JSON" else ""
        return None, [problem_at(where, "", f"cannot read {kind}: {exc}; fix the syntax{hint}")]
    if not isinstance(data, dict):
        return None, [problem_at(where, "", f"top level must be a mapping, got {type(data).__name__}")]
    return data, []


def load_json_config(path: Path) -> tuple[dict[str, Any] | None, Problems]:
    """A DeepSpeed JSON as a dict, or None plus the parser's complaint."""
    return _load(Path(path), "JSON")


def load_yaml_file(path: Path) -> tuple[dict[str, Any] | None, Problems]:
    """An accelerate YAML as a dict, or None plus the parser's complaint."""
    return _load(Path(path), "YAML")


def mapping_section(cfg: Cfg, key: str) -> dict[str, Any]:
    """`cfg[key]` when it is a mapping, else {} (a wrong type is reported by the rule that owns the key)."""
    value = cfg.get(key)
    return value if isinstance(value, dict) else {}
