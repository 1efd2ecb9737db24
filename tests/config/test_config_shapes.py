"""The tasks' `model:` and `data:` shapes (issue 32 §3): one `Source` type wherever a model or data set
comes from, video_lora's base model as one choice (`model.base`), one name per concept, and every key
renamed on the way gives "renamed to" in a user's config and moves silently in a config framer_ds
recorded (tests/data/recorded_configs/: the shipped configs as framer_ds resolved and recorded them
before the change, written by scripts/dev/make_recorded_configs.py)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from framer_ds.config.errors import ConfigError
from framer_ds.config.renames import schema_renames
from framer_ds.tasks.registry import available_tasks, get_task_class
from framer_ds.tasks.run_config import load_run_config, validate_run_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
RECORDED = REPO / "tests" / "data" / "recorded_configs"
SHIPPED = sorted(p for p in CONFIGS.rglob("*.yaml") if "task" in (yaml.safe_load(p.read_text()) or {}))


def _problems(path: Path, overrides: list[str]) -> list[str]:
    """The problem lines of loading `path` with `overrides`, without the "(in override ...)" they end with."""
    with pytest.raises(ConfigError) as info:
        load_run_config(path, overrides)
    return [re.sub(r" \(in override [^)]*\)$", "", str(p)) for p in info.value.problems]


# --- one Source type ------------------------------------------------------------------------------------

# (config, the source's key, the option the config sets, every option as the message names them)
SOURCES = [
    ("quickstart.yaml", "data.source", "builtin", "path or builtin (digits)"),
    ("quickstart.yaml", "model.source", "config", "path or config"),
    ("tasks/video_lora/tiny.yaml", "model.source", "builtin", "path or builtin (tiny_svd)"),
    ("tasks/video_lora/tiny.yaml", "data.source", "builtin", "path or builtin (synthetic_clips)"),
    ("tasks/video_lora/framer_tiny.yaml", "model.base.source", "builtin", "path or builtin (tiny_framer)"),
    ("tasks/tts_lm/tiny.yaml", "model.source", "builtin", "path, config or builtin (tiny_llama)"),
    ("tasks/tts_lm/tiny.yaml", "data.source", "builtin", "path or builtin (tiny_speech)"),
    ("tasks/drivable_vit/tiny.yaml", "data.source", "builtin", "path or builtin (synthetic_roads)"),
]


@pytest.mark.parametrize(
    ("config", "key", "given", "options"), SOURCES, ids=[f"{c}:{k}" for c, k, *_ in SOURCES]
)
def test_every_source_takes_exactly_one_option_with_one_message(config, key, given, options):
    """Two options set, or none: one line at the source's key naming all its options (the seven
    "exactly one of" validators this replaces each had their own). Both in one mapping: an override of
    one option replaces the file's (tests/config/test_one_of_overrides.py)."""
    path = CONFIGS / config
    section = yaml.safe_load(path.read_text())
    for part in key.split("."):
        section = section[part]
    assert _problems(path, [f"{key}={json.dumps({**section, 'path': '/x'})}"]) == [
        f"{key}: set exactly one of {options}; got path and {given}."
    ]
    assert _problems(path, [f"{key}.{given}=null"]) == [f"{key}: set exactly one of {options}; got none."]


def test_a_fresh_model_config_is_a_third_option_of_tts_lm_source(tmp_path):
    """tts_lm builds a random model from AutoConfig fields: `model.source.config`, exclusive with path and
    builtin; it names its model_type, and a fresh model needs a tokenizer."""
    tiny = CONFIGS / "tasks" / "tts_lm" / "tiny.yaml"
    fresh = ["model.source.builtin=null", "model.source.config={model_type: llama, hidden_size: 32}"]
    assert _problems(tiny, fresh) == [
        "model: model.source.config builds a fresh model: set model.tokenizer too."
    ]
    assert _problems(tiny, [*fresh[:1], "model.source.config={hidden_size: 32}", "model.tokenizer=/t"]) == [
        "model.source: config needs `model_type` (e.g. llama, granite, qwen3)."
    ]
    config = load_run_config(tiny, [*fresh, "model.tokenizer=/t"])
    assert config.model.source.fresh_config == {"model_type": "llama", "hidden_size": 32}


# --- video_lora: the base model is one choice -------------------------------------------------------------


def test_video_base_is_one_choice_that_cannot_hold_an_invalid_combination():
    tiny, framer = (
        CONFIGS / "tasks" / "video_lora" / "tiny.yaml",
        CONFIGS / "tasks" / "video_lora" / "framer_tiny.yaml",
    )
    svd = load_run_config(tiny, ["model.base={mode: image_to_video}"]).model.base
    assert (svd.name, svd.mode) == ("svd", "image_to_video")  # without a name: svd, as with no base at all
    assert load_run_config(framer).model.base.mode == "interpolation"
    found = _problems(tiny, ["model.base.name=hunyuan"])
    assert len(found) == 1 and found[0].startswith("model.base: "), found
    assert "'svd', 'framer', 'wan'" in found[0], found
    # a Wan base names its own folder and mode: the SVD keys it lacks are named, not guessed
    wan = _problems(tiny, ["model.base.name=wan"])
    assert any(line.startswith("model.base.source: required key is missing") for line in wan), wan
    # svd has no Framer options, Framer has no other mode; keys are named without pydantic's union tag
    assert _problems(tiny, ["model.base.train_modules=both"])[0].startswith(
        "model.base.train_modules: unknown key. Remove it or fix the spelling. Valid keys here: mode, name."
    )
    assert _problems(framer, ["model.base.mode=image_to_video"]) == [
        "model.base.mode: got 'image_to_video': Input should be 'interpolation'."
    ]
    missing = _problems(framer, ["model.base={name: framer}"])
    assert missing == [
        "model.base.source: required key is missing; add it (The Framer checkpoint: path or builtin.)."
    ]
    assert (
        "Valid keys here: controlnet_cond_scale, controlnet_step_range, mode, name, source, train_modules"
        in (_problems(framer, ["model.base.train_module=both"])[0])
    )


def test_config_reference_lists_every_base_members_keys_and_each_tasks_renamed_keys():
    from framer_ds.tasks.config_docs import config_docs_markdown, task_reference

    markdown = config_docs_markdown()
    assert "| `model.framer.path` | `model.base.source.path` |" in markdown
    assert "| `data.validation_split` | `data.val_fraction` |" in markdown
    keys = {row.key for row in task_reference("video_lora")}
    assert {
        "model.base.name",
        "model.base.mode",
        "model.base.source.path",
        "model.base.train_modules",
    } <= keys


# --- renamed keys ----------------------------------------------------------------------------------------


def _pop(tree: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    """Remove `dotted` from `tree`, and the mappings it leaves empty; (found, value)."""
    *parents, last = dotted.split(".")
    chain, node = [], tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            return False, None
        chain.append((node, part))
        node = node[part]
    if last not in node:
        return False, None
    value = node.pop(last)
    for parent, part in reversed(chain):
        if parent[part] == {}:
            del parent[part]
    return True, value


def _old_shape(dumped: dict[str, Any], renames: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """A config as a user of the previous shape writes it (every renamed key back at its old place, last
    rename first) and the lines validation owes it."""
    old = copy.deepcopy(dumped)
    lines = []
    for old_key, new_key in reversed(list(renames.items())):
        found, value = _pop(old, new_key)
        if not found:
            continue
        *parents, last = old_key.split(".")
        node = old
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        shown = json.dumps(value) if value is None or isinstance(value, bool | list | dict) else repr(value)
        lines.append(f"{old_key}: was renamed to {new_key}; write `{new_key}: {shown}` instead")  # YAML
    return old, lines


@pytest.mark.parametrize("config", SHIPPED, ids=[p.relative_to(CONFIGS).as_posix() for p in SHIPPED])
def test_every_renamed_key_names_its_new_key_in_each_shipped_config(config):
    """Each shipped config, its renamed keys written the old way: one "renamed to" line per key, nothing
    else (not "unknown key", not the new section missing), all at once."""
    current = load_run_config(config)
    renames = schema_renames(type(current))
    old, expected = _old_shape(current.model_dump(mode="json"), renames)
    with pytest.raises(ConfigError) as info:
        validate_run_config(old, "old")
    assert sorted(str(p) for p in info.value.problems) == sorted(expected)


def test_the_shipped_configs_exercise_every_rename():
    """The test above covers every task's renames (a rename no shipped config can hold is untested)."""
    covered: dict[str, set[str]] = {}
    for config in SHIPPED:
        current = load_run_config(config)
        renames = schema_renames(type(current))
        _, lines = _old_shape(current.model_dump(mode="json"), renames)
        covered.setdefault(current.task, set()).update(line.split(":")[0] for line in lines)
    for task in available_tasks():
        if task in covered:
            task_renames = {
                key
                for key in schema_renames(get_task_class(task).config_class())
                if not key.startswith("train.")
            }  # train:'s renames are every task's: tests/config/test_config_renames.py covers each of them
            assert {key for key in covered[task] if not key.startswith("train.")} == task_renames, task


RECORDED_CONFIGS = sorted(RECORDED.glob("*.yaml"))


@pytest.mark.parametrize("recorded", RECORDED_CONFIGS, ids=[p.stem for p in RECORDED_CONFIGS])
def test_a_config_recorded_in_the_previous_shape_still_loads_as_the_same_config(recorded):
    """What a checkpoint or an export holds from before the change (`config.yaml`, the export record's
    config) validates with recorded=True, as `sample`, `eval` and resume read it, into exactly the config
    the shipped YAML gives today."""
    raw = yaml.safe_load(recorded.read_text())
    shipped = CONFIGS / raw.pop("_shipped")  # the shipped config it was dumped from
    migrated = validate_run_config(raw, str(recorded), recorded=True)
    today = load_run_config(shipped, [f"output_dir={raw['output_dir']}"])
    assert migrated.model_dump(mode="json") == today.model_dump(mode="json")
    with pytest.raises(ConfigError, match="was renamed to"):
        validate_run_config(raw, "a user's config")


def test_the_recorded_configs_cover_every_task_and_base():
    names = {p.stem for p in RECORDED_CONFIGS}
    assert {"quickstart", "vit_large_imagenet", "video_lora_tiny", "video_lora_framer_tiny", "tts_lm_tiny",
            "drivable_vit_tiny"} <= names  # fmt: skip


@pytest.mark.parametrize("recorded", RECORDED_CONFIGS, ids=[p.stem for p in RECORDED_CONFIGS])
def test_a_checkpoint_of_the_previous_shape_resumes_with_no_change(recorded, tmp_path):
    """Resume compares the checkpoint's config with the run's: the previous shape of the same config is
    no change (an old `config: {}` beside a model path included, which `source` reads as no config)."""
    from framer_ds.engine.checkpoint import CHECKPOINT_CONFIG, TrainerState
    from framer_ds.engine.resume.changes import resume_changes

    raw = yaml.safe_load(recorded.read_text())
    shipped = CONFIGS / raw.pop("_shipped")
    (tmp_path / CHECKPOINT_CONFIG).write_text(yaml.safe_dump(raw))
    today = load_run_config(shipped, [f"output_dir={raw['output_dir']}"])
    assert resume_changes(tmp_path, today, TrainerState(global_step=1, world_size=1), 1) == []
