"""Renamed keys: a user's old YAML gets "renamed to <new key>", a config framer_ds recorded is moved.

The renames here are made up for the test (monkeypatched onto real sections), so the mechanism is
checked independently of which keys the schema happens to have renamed in this version.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from framer_ds.config.errors import ConfigError
from framer_ds.config.loader import dump_run_config
from framer_ds.config.renames import move_renamed_keys, renamed_key_problems, schema_renames
from framer_ds.config.schema import LogConfig, TrainConfig
from framer_ds.tasks.run_config import load_run_config, validate_run_config

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.yaml"


@pytest.fixture
def renamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`train.random_seed` became `train.seed`; `log.use_tensorboard` became `log.tensorboard`."""
    monkeypatch.setattr(TrainConfig, "renamed_keys", {"random_seed": "seed"})
    monkeypatch.setattr(LogConfig, "renamed_keys", {"use_tensorboard": "tensorboard"})


def test_renames_are_collected_from_every_section_as_dotted_paths(renamed):
    schema = type(load_run_config(QUICKSTART))
    renames = schema_renames(schema)
    assert renames["train.random_seed"] == "train.seed"
    assert renames["log.use_tensorboard"] == "log.tensorboard"


def test_an_old_key_in_a_user_config_names_the_new_key_once(renamed, tmp_path):
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw.setdefault("train", {})["random_seed"] = 7
    raw.setdefault("log", {})["use_tensorboard"] = True
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    lines = [str(p) for p in info.value.problems]
    assert lines == [
        "train.random_seed: was renamed to train.seed; write `train.seed: 7` instead",
        "log.use_tensorboard: was renamed to log.tensorboard; write `log.tensorboard: True` instead",
    ], lines  # both at once, and neither a second time as "unknown key"


def test_an_old_key_in_an_override_names_the_override(renamed):
    with pytest.raises(ConfigError) as info:
        load_run_config(QUICKSTART, ["train.random_seed=3"])
    (problem,) = info.value.problems
    assert (
        "renamed to train.seed" in problem.message and "(in override train.random_seed=3)" in problem.message
    )


def test_a_recorded_config_with_old_keys_is_migrated(renamed, tmp_path):
    config = load_run_config(QUICKSTART, ["train.seed=11"])
    recorded = yaml.safe_load(dump_run_config(config))
    recorded["train"]["random_seed"] = recorded["train"].pop("seed")
    migrated = validate_run_config(recorded, "recorded", recorded=True)
    assert migrated.train.seed == 11
    with pytest.raises(ConfigError):
        validate_run_config(recorded, "written by a user")


def test_moving_keeps_an_explicit_new_key_and_creates_missing_sections():
    raw = {"a": {"old": 1, "new": 2}, "b": {"gone": 3}}
    moved = move_renamed_keys(raw, {"a.old": "a.new", "b.gone": "c.d.here"})
    assert moved == {"a": {"new": 2}, "b": {}, "c": {"d": {"here": 3}}}
    assert raw == {"a": {"old": 1, "new": 2}, "b": {"gone": 3}}  # the input is not changed
    assert renamed_key_problems({"a": 5}, {"a.old": "a.new"}) == []  # a value where a section was
