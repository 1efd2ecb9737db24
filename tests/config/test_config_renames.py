"""Renamed keys: a user's old YAML gets "renamed to <new key>", a config framer_ds recorded is moved.

The first tests use renames made up for the test (monkeypatched onto real sections), so the mechanism
is checked independently of which keys the schema renamed; the rest check the real renames of `train:`
(its flat keys grouped, its steps-or-epochs pairs one Cadence) against real configs and an old run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import mlp_config, read_metrics, train_in_process
from framer_ds.config.cadence import Cadence
from framer_ds.config.errors import ConfigError
from framer_ds.config.loader import dump_run_config, parse_yaml
from framer_ds.config.renames import move_renamed_keys, renamed_key_problems, schema_renames
from framer_ds.config.schema import LogConfig, TrainConfig
from framer_ds.engine.checkpoint import CHECKPOINT_CONFIG
from framer_ds.engine.export import EXPORT_RECORD
from framer_ds.engine.manifest import write_manifest
from framer_ds.tasks.run_config import (
    load_exported_task,
    load_run_config,
    resolved_value,
    validate_run_config,
)

REPO = Path(__file__).resolve().parents[2]
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
        "log.use_tensorboard: was renamed to log.tensorboard; write `log.tensorboard: true` instead",
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


# --- the renames of `train:` (flat keys grouped, steps-or-epochs pairs become one Cadence) ------------

# A valid value for every old key of TrainConfig, none of them a default.
OLD_VALUES = {
    "max_steps": 5,
    "epochs": 2,
    "learning_rate": 0.01,
    "weight_decay": 0.1,
    "adam_beta1": 0.8,
    "adam_beta2": 0.99,
    "adam_epsilon": 1e-06,
    "max_grad_norm": 0.5,
    "lr_scheduler": "linear",
    "warmup_steps": 3,
    "warmup_ratio": 0.1,
    "eval_every": 4,
    "eval_every_epochs": 0.5,
    "max_eval_batches": 2,
    "best_metric": "eval/loss",
    "best_mode": "min",
    "checkpoint_every": 6,
    "checkpoint_every_epochs": 1.5,
    "keep_last_checkpoints": 3,
    "nonfinite_loss": "abort",
    "max_consecutive_nonfinite": 2,
}
# best_metric and best_mode are valid only together.
PARTNER = {"best_metric": ("eval.best_mode", "min"), "best_mode": ("eval.best_metric", "eval/loss")}


def test_every_old_train_key_has_a_value_here():
    assert set(OLD_VALUES) == set(TrainConfig.renamed_keys)


@pytest.mark.parametrize(("old", "new"), sorted(TrainConfig.renamed_keys.items()))
def test_every_renamed_train_key_names_its_new_key_and_the_line_works(old, new, tmp_path):
    value = OLD_VALUES[old]
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["train"][old] = value
    if old in PARTNER:  # the partner at its new place: the old key is validated where it moved to
        section, key = PARTNER[old][0].split(".")
        raw["train"].setdefault(section, {})[key] = PARTNER[old][1]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    written = f"'{value}'" if isinstance(value, str) else str(value)
    assert [str(p) for p in info.value.problems] == [
        f"train.{old}: was renamed to train.{new}; write `train.{new}: {written}` instead"
    ]  # one line, not a second one as "unknown key"
    # The line, followed, gives the value at its new place.
    partner = [f"train.{PARTNER[old][0]}={PARTNER[old][1]}"] if old in PARTNER else []
    config = load_run_config(QUICKSTART, [f"train.{new}={value}", *partner])
    node = config
    for part in f"train.{new}".split("."):
        node = getattr(node, part)
    assert node == value


def test_an_old_null_half_of_a_pair_says_to_write_the_cadence_null():
    with pytest.raises(ConfigError) as info:
        load_run_config(QUICKSTART, ["train.eval_every=null", "train.warmup_steps=0"])
    assert [str(p) for p in info.value.problems] == [
        "train.warmup_steps: was renamed to train.lr_schedule.warmup.steps; write "
        "`train.lr_schedule.warmup: null` instead (in override train.warmup_steps=0)",
        "train.eval_every: was renamed to train.eval.every.steps; write `train.eval.every: null` instead "
        "(in override train.eval_every=null)",
    ]


# Configs recorded by framer_ds 0.2.0 before the rename (commit e005c74), every default written out:
# the MLP test task's (`max_steps: 16` AND `epochs: 1`, `eval_every_epochs: null`, ...) and the
# quickstart's (`epochs: 30`, `warmup_ratio: 0.05`, `*_every_epochs: 10`). Made with that commit's code
# (`git archive e005c74`, then `dump_run_config(load_run_config(...))` of that commit's
# configs/quickstart.yaml and of its tests/conftest.py `mlp_config(path, Path("/old/run"),
# train={"checkpoint_every": 8, "eval_every": 4, "keep_last_checkpoints": 3, "best_metric": "eval/loss",
# "best_mode": "min", "max_eval_batches": 2})`).
RECORDED = REPO / "tests" / "data" / "recorded_before_cadence"
# The MLP run of mlp_config.yaml in this version's keys (conftest.mlp_config sets the rest alike).
MLP_TRAIN = {
    "checkpoint.every.steps": 8,
    "eval.every.steps": 4,
    "checkpoint.keep_last": 3,
    "eval.best_metric": "eval/loss",
    "eval.best_mode": "min",
    "eval.max_batches": 2,
}


def recorded(name: str) -> dict:
    return parse_yaml((RECORDED / name).read_text())


def test_configs_recorded_before_the_rename_migrate_to_the_values_they_meant(tmp_path):
    mlp = validate_run_config(recorded("mlp_config.yaml"), "recorded", recorded=True)
    train = mlp.train
    assert train.length == Cadence(steps=16)  # it recorded max_steps: 16 AND epochs: 1; max_steps won
    assert (train.lr_schedule.warmup, train.eval.every) == (Cadence(steps=2), Cadence(steps=4))
    assert (train.checkpoint.every, train.checkpoint.keep_last) == (Cadence(steps=8), 3)
    assert (train.eval.best_metric, train.eval.best_mode, train.eval.max_batches) == ("eval/loss", "min", 2)
    same = load_run_config(mlp_config(tmp_path / "mlp.yaml", Path("/old/run"), train=MLP_TRAIN))
    assert mlp.model_dump() == same.model_dump()
    quickstart = validate_run_config(recorded("quickstart_config.yaml"), "recorded", recorded=True)
    assert quickstart.train.length == Cadence(epochs=30)  # max_steps was null: epochs was in effect
    assert quickstart.train.lr_schedule.warmup == Cadence(fraction=0.05)
    assert quickstart.model_dump() == load_run_config(QUICKSTART).model_dump()
    with pytest.raises(ConfigError):
        validate_run_config(recorded("mlp_config.yaml"), "written by a user")


def test_a_run_directory_written_before_the_rename_resumes_and_its_exports_load(tmp_path, capsys):
    """A 16-step run whose recorded configs (config.yaml, the step_8 checkpoint's, final/'s and best/'s
    records) are replaced by what framer_ds 0.2.0 wrote for the same run: eval, sample and export start
    from the export's record (load_exported_task), and a resume from step_8 changes nothing and trains
    steps 9-16 as the run did: the same computation (one process, restored RNG and data position), so
    the losses are equal, not close."""
    run = tmp_path / "run"
    path = mlp_config(tmp_path / "mlp.yaml", run, train=MLP_TRAIN)
    train_in_process(path)
    straight = {line["step"]: line["loss"] for line in read_metrics(run)[0]}
    old_text = (RECORDED / "mlp_config.yaml").read_text()  # output_dir /old/run: not compared on resume
    step_8 = run / "checkpoints" / "step_8"
    for config_yaml in (run / "config.yaml", step_8 / CHECKPOINT_CONFIG):
        config_yaml.write_text(old_text)
    write_manifest(step_8)
    for export in (run / "final", run / "best"):
        record = json.loads((export / EXPORT_RECORD).read_text())
        record["config"] = parse_yaml(old_text)
        (export / EXPORT_RECORD).write_text(json.dumps(record))
        assert load_exported_task(export).config.train.length == Cadence(steps=16)
    capsys.readouterr()
    result = train_in_process(path, [f"train.resume={step_8}"])
    out = capsys.readouterr().out
    assert f"resumed from {step_8} at step 8" in out and "changed on resume" not in out
    resumed = {line["step"]: line["loss"] for line in read_metrics(run)[0]}
    assert result.global_step == 16
    assert [resumed[step] for step in range(9, 17)] == [straight[step] for step in range(9, 17)]


def test_config_get_of_a_renamed_key_names_the_new_one():
    """A launch script written for an older version asks `framer-ds config get CONFIG train.max_steps`."""
    with pytest.raises(ConfigError) as info:
        resolved_value(load_run_config(QUICKSTART), "train.max_steps")
    assert [str(p) for p in info.value.problems] == [
        "train.max_steps: was renamed to train.length.steps; ask for that key instead"
    ]
    assert json.loads(resolved_value(load_run_config(QUICKSTART), "train.length")) == {"epochs": 30}


def test_an_old_steps_and_epochs_pair_reads_as_the_old_code_read_it(tmp_path):
    """`max_steps: 5` + `epochs: 2` (the old shape, max_steps winning): both keys get their line and
    nothing else; moved into `length` together they would add "set exactly one of steps, epochs"."""
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["train"].pop("length", None)
    raw["train"].update({"max_steps": 5, "epochs": 2})
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    assert [p.where for p in info.value.problems] == ["train.max_steps", "train.epochs"]
