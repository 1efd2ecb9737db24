"""One override rule for every one-of group (framer_ds/config/one_of.py, issue 45 item 7): setting one
member on the command line replaces the choice the file made, two members among the overrides are one
line naming both, and tts_lm's speaker prefix follows the data's layout unless the user sets it.

Every case loads a shipped config for real (validation only: nothing is built or trained). A one-of group
declared without a case here fails `test_every_one_of_group_has_a_case`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from framer_ds.config.errors import ConfigError
from framer_ds.config.loader import dump_run_config
from framer_ds.config.one_of import one_of_groups
from framer_ds.config.schema import RunConfigBase
from framer_ds.tasks.config_docs import builtin_task_names
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config, validate_run_config
from framer_ds.tasks.tts_lm.data_setup import TtsData

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
VIDEO, TTS = CONFIGS / "tasks" / "video_lora", CONFIGS / "tasks" / "tts_lm"

# (shipped config, the member an override sets, its value): the file chooses another member of the group.
CASES = [
    (VIDEO / "tiny.yaml", "data.source.path", "/my/videos"),  # the command
    (VIDEO / "tiny.yaml", "model.source.path", "/models/svd"),
    (VIDEO / "tiny.yaml", "data.stride_range", [1, 3]),  # data.stride: 2 in the file
    (VIDEO / "wan_tiny.yaml", "data.stride_range", [1, 2]),
    (VIDEO / "framer_tiny.yaml", "model.base.source.path", "/models/framer_512x320"),
    (VIDEO / "wan_tiny.yaml", "model.base.source.path", "/models/wan"),
    (TTS / "tiny.yaml", "model.source.path", "/models/llama"),
    (TTS / "tiny.yaml", "data.source.path", "/data/rows.jsonl"),
    (CONFIGS / "quickstart.yaml", "model.source.path", "/models/vit"),  # the file builds from `config`
    (CONFIGS / "quickstart.yaml", "data.source.path", "/data/imagenet"),
    (CONFIGS / "tasks" / "drivable_vit" / "tiny.yaml", "data.source.path", "/data/roads.jsonl"),
    # the cadences: the rule they had alone is now this one
    (CONFIGS / "quickstart.yaml", "train.length.steps", 20),
    (CONFIGS / "quickstart.yaml", "train.lr_schedule.warmup.steps", 3),
    (CONFIGS / "quickstart.yaml", "train.eval.every.steps", 5),
    (CONFIGS / "quickstart.yaml", "train.checkpoint.every.steps", 5),
]


def _value(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def _problems(path: Path, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_run_config(path, overrides)
    return [str(p) for p in info.value.problems]


def _group_of(task: str, member: str) -> tuple[str, ...]:
    (group,) = [g for g in one_of_groups(get_task_class(task).config_class()).groups if member in g]
    return group


@pytest.mark.parametrize(
    ("path", "member", "value"), CASES, ids=[f"{p.parent.name}/{p.name}:{m}" for p, m, _ in CASES]
)
def test_an_override_of_one_member_replaces_the_files_choice(path, member, value):
    """The override's member is chosen and the file's is dropped, in the validated config and in the
    config.yaml a run would record (which reads back the same)."""
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...")
    config = load_run_config(path, [f"{member}={text}"])
    rivals = [m for m in _group_of(config.task, member) if m != member]
    chosen = _value(config, member)
    assert chosen == (tuple(value) if isinstance(value, list) else Path(value) if "path" in member else value)
    assert [_value(config, rival) for rival in rivals] == [None] * len(rivals)
    assert validate_run_config(yaml.safe_load(dump_run_config(config)), "config.yaml") == config


def test_every_one_of_group_has_a_case():
    """Each group the built-in tasks' schemas declare is exercised above against a shipped config: each
    task's own, and those every task shares (the cadences) once (overwrite_output_dir/train.resume:
    test_config.py)."""
    shared = set(one_of_groups(RunConfigBase).groups) - {("overwrite_output_dir", "train.resume")}
    declared = {("every task", group) for group in shared} | {
        (name, group)
        for name in builtin_task_names()
        for group in one_of_groups(get_task_class(name).config_class()).groups
        if group not in shared | {("overwrite_output_dir", "train.resume")}
    }
    tasks = {path: yaml.safe_load(path.read_text())["task"] for path, _, _ in CASES}
    groups = [(tasks[path], _group_of(tasks[path], member)) for path, member, _ in CASES]
    covered = {("every task" if group in shared else task, group) for task, group in groups}
    assert declared - covered == set()


def test_a_key_inside_a_member_chooses_it():
    """`model.source.config.<field>` sets the `config` option of tts_lm's model source: the file's
    builtin goes, as for `model.source.config={...}`."""
    config = load_run_config(
        TTS / "tiny.yaml", ["model.source.config.model_type=llama", "model.tokenizer=/tokenizer"]
    )
    assert (config.model.source.builtin, config.model.source.path) == (None, None)
    assert config.model.source.fresh_config == {"model_type": "llama"}


def test_among_the_overrides_the_later_member_wins():
    """As a later flag replaces an earlier one: a script's common overrides, then the run's own."""
    tiny = VIDEO / "tiny.yaml"
    config = load_run_config(tiny, ["data.source.path=/my/videos", "data.source.builtin=synthetic_clips"])
    assert (config.data.source.path, config.data.source.builtin) == (None, "synthetic_clips")
    config = load_run_config(tiny, ["data.stride=2", "data.stride_range=[1, 3]"])
    assert (config.data.stride, config.data.stride_range) == (None, (1, 3))


def test_null_chooses_nothing_so_the_old_spelling_still_works():
    """`data.source.builtin=null data.source.path=DIR` (what users wrote before) is no pair: null only
    unsets; a group left with no choice is still refused by its section."""
    tiny = VIDEO / "tiny.yaml"
    for overrides in (
        ["data.source.builtin=null", "data.source.path=/my/videos"],
        ["data.source.path=/my/videos", "data.source.builtin=null"],
    ):
        assert load_run_config(tiny, overrides).data.source.path == Path("/my/videos")
    assert _problems(tiny, ["data.source.builtin=null"]) == [
        "data.source: set exactly one of path or builtin (synthetic_clips); got none. "
        "(in override data.source.builtin=null)"
    ]


def test_a_renamed_key_beside_a_choice_is_reported_once(tmp_path):
    """An old key that moves into a group holding a choice (`data.root` beside `data.source.builtin`)
    does not move, so the user reads one "renamed to" line, not that and "path and builtin both set"."""
    raw = yaml.safe_load((VIDEO / "tiny.yaml").read_text())
    raw["data"]["root"] = "/my/videos"
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert _problems(path, []) == [
        "data.root: was renamed to data.source.path; write `data.source.path: '/my/videos'` instead"
    ]


# --- tts_lm: the speaker prefix follows the layout -----------------------------------------------------

LJSPEECH = ["data.source.path=/data/LJSpeech-1.1", "data.format=audio", "data.layout=ljspeech"]


def _speaker_problems(overrides: list[str]) -> list[str]:
    config = load_run_config(TTS / "tiny.yaml", overrides)
    return [str(p) for p in TtsData(config, assets=None).speaker_problems()]


def test_an_ljspeech_layout_on_the_tiny_config_trains_one_voice_without_a_prefix():
    """The tiny config prefixes its two synthetic speakers (its speaker_column); pointed at an LJSpeech
    folder, one voice, the prefix is off by itself instead of refused until the user flips it."""
    assert load_run_config(TTS / "tiny.yaml").data.speaker_prefix is True
    config = load_run_config(TTS / "tiny.yaml", LJSPEECH)
    assert config.data.speaker_prefix is False
    assert yaml.safe_load(dump_run_config(config))["data"]["speaker_prefix"] is False  # what ran, recorded
    assert _speaker_problems(LJSPEECH) == []


def test_an_explicit_speaker_prefix_is_honoured_and_a_contradiction_still_refused():
    assert load_run_config(TTS / "tiny.yaml", ["data.speaker_prefix=false"]).data.speaker_prefix is False
    assert _speaker_problems([*LJSPEECH, "data.speaker_prefix=true"]) == [
        "data.speaker_prefix: an 'ljspeech' layout names no speakers (one voice): set data.speaker_prefix "
        "false"
    ]
    folder = ["data.source.path=/data/voices", "data.format=audio", "data.layout=folder"]
    assert load_run_config(TTS / "tiny.yaml", folder).data.speaker_prefix is True  # subfolders name them
    assert _speaker_problems([*folder, "data.speaker_prefix=null"]) == []  # a default asks for nothing
