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


def test_a_key_that_became_its_own_section_is_old_only_while_it_holds_a_plain_value():
    """`model.base: framer` -> `model.base.name`: the new section at the same key is not an old key."""
    renames = {"m.base": "m.base.name", "m.mode": "m.base.mode"}
    old = {"m": {"base": "framer", "mode": "interpolation"}}
    assert move_renamed_keys(old, renames) == {"m": {"base": {"name": "framer", "mode": "interpolation"}}}
    assert [p.where for p in renamed_key_problems(old, renames)] == ["m.base", "m.mode"]
    new = {"m": {"base": {"name": "framer", "mode": "interpolation"}}}
    assert move_renamed_keys(new, renames) == new and renamed_key_problems(new, renames) == []


def test_a_section_whose_keys_all_moved_is_dropped_when_left_empty_or_null():
    """`model.framer.*` -> `model.base.*`: what a recorded config holds there (null, or its moved keys) goes;
    a section that still has a key of its own stays (and validation names that key)."""
    renames = {
        "m.framer.path": "m.base.source.path",
        "m.framer.scale": "m.base.scale",
        "t.max": "t.length.max",
    }
    assert move_renamed_keys({"m": {"framer": None}, "t": {}}, renames) == {"m": {}, "t": {}}
    moved = move_renamed_keys({"m": {"framer": {"path": "/f", "scale": 2}}, "t": {"max": 3}}, renames)
    assert moved == {"m": {"base": {"source": {"path": "/f"}, "scale": 2}}, "t": {"length": {"max": 3}}}
    kept = move_renamed_keys({"m": {"framer": {"path": "/f", "typo": 1}}}, renames)
    assert kept == {"m": {"framer": {"typo": 1}, "base": {"source": {"path": "/f"}}}}


def test_an_old_key_is_validated_at_its_new_place_so_nothing_else_is_reported(renamed, tmp_path):
    """The old key's value still reaches validation (moved): a wrong value is named at the new key."""
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["train"]["random_seed"] = raw["train"].pop("seed") and "oops"
    with pytest.raises(ConfigError) as info:
        validate_run_config(raw)
    lines = [str(p) for p in info.value.problems]
    assert lines[0] == "train.random_seed: was renamed to train.seed; write `train.seed: 'oops'` instead"
    assert len(lines) == 2 and lines[1].startswith("train.seed: got 'oops'"), lines
