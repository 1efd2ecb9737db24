"""`Cadence` (framer_ds/config/cadence.py): exactly one of steps, epochs or a fraction of the run, one
conversion to optimizer steps, and an override of one unit that replaces the cadence it belongs to.

The configs are the shipped quickstart (`length: {epochs: 30}`, warmup, eval and checkpoints as
cadences), validated for real; nothing trains here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from framer_ds.config.cadence import Cadence
from framer_ds.config.errors import ConfigError
from framer_ds.config.one_of import one_of_groups
from framer_ds.config.schema import RunConfigBase
from framer_ds.tasks.run_config import load_run_config

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.yaml"


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_run_config(QUICKSTART, overrides)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(
    ("cadence", "steps"),
    [
        # 10 optimizer steps per epoch, 40 in the run.
        (Cadence(steps=3), 3),
        (Cadence(epochs=2), 20),
        (Cadence(epochs=0.25), 3),  # 2.5 steps: rounded up, a share of a step still asks for it
        (Cadence(fraction=0.5), 20),
        (Cadence(fraction=0.01), 1),  # 0.4 of a step: at least the one step it touches
        (Cadence(fraction=1), 40),
    ],
)
def test_one_method_resolves_every_unit_to_optimizer_steps(cadence, steps):
    assert cadence.resolve(updates_per_epoch=10, total_steps=40) == steps


def test_a_fraction_needs_the_runs_total():
    with pytest.raises(ValueError, match="total steps"):
        Cadence(fraction=0.5).resolve(updates_per_epoch=10)


def test_each_use_takes_one_unit_of_those_it_accepts():
    config = load_run_config(
        QUICKSTART,
        [
            "train.length.steps=7",
            "train.lr_schedule.warmup.epochs=0.5",
            "train.eval.every.fraction=0.25",
            "train.checkpoint.every.steps=2",
        ],
    )
    train = config.train
    assert (train.length, train.lr_schedule.warmup) == (Cadence(steps=7), Cadence(epochs=0.5))
    assert (train.eval.every, train.checkpoint.every) == (Cadence(fraction=0.25), Cadence(steps=2))
    assert load_run_config(QUICKSTART, ["train.length.epochs=1.5"]).train.length == Cadence(epochs=1.5)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ['train.length={"steps": 4, "epochs": 3}'],
            "train.length: set exactly one of steps, epochs or fraction (got steps and epochs): they say "
            "the same thing in different units.",
        ),
        (
            ["train.eval.every={}"],
            "train.eval.every: set exactly one of steps, epochs or fraction (got none): they say the same "
            "thing in different units.",
        ),
        (
            ["train.length.fraction=0.5"],
            "train.length: takes steps or epochs, not fraction (a share of the run cannot set the run's "
            "length).",
        ),
        (["train.checkpoint.every.steps=0"], "train.checkpoint.every.steps: got 0: Input should be"),
        (["train.eval.every.epochs=-1"], "train.eval.every.epochs: got -1: Input should be greater than 0."),
        (["train.lr_schedule.warmup.fraction=1.5"], "train.lr_schedule.warmup.fraction: got 1.5: Input"),
    ],
)
def test_refused_cadences_get_one_clear_line_each(overrides, line):
    (found,) = problems(*overrides)
    assert found.startswith(line), found


def test_refused_cadences_are_reported_all_at_once():
    found = problems('train.length={"steps": 4, "epochs": 3}', "train.eval.every={}")
    assert [line.split(":")[0] for line in found] == ["train.length", "train.eval.every"]


def test_an_override_of_one_unit_replaces_the_cadence():
    """quickstart.yaml says `length: {epochs: 30}`, `eval.every: {epochs: 10}`: tests and users set
    steps on top of it, which must mean those steps, not "two units set"."""
    config = load_run_config(QUICKSTART, ["train.length.steps=4", "train.eval.every.steps=2"])
    assert config.train.length == Cadence(steps=4)
    assert config.train.eval.every == Cadence(steps=2)
    nulled = load_run_config(QUICKSTART, ["train.eval.every=null", "train.eval.every.steps=5"])
    assert nulled.train.eval.every == Cadence(steps=5)


def test_of_two_units_of_one_cadence_on_the_command_line_the_later_wins():
    """Each replaces the unit before it, the file's or an earlier override's, as for any one-of group."""
    config = load_run_config(QUICKSTART, ["train.length.steps=4", "train.length.epochs=2"])
    assert config.train.length == Cadence(epochs=2)


def test_every_cadence_is_a_one_of_group_found_from_the_schema():
    """A section that is not a cadence keeps its other keys when one is overridden."""
    cadences = {group for group in one_of_groups(RunConfigBase).groups if group[0].endswith(".steps")}
    assert cadences == {
        tuple(f"{path}.{unit}" for unit in ("steps", "epochs", "fraction"))
        for path in ("train.length", "train.lr_schedule.warmup", "train.eval.every", "train.checkpoint.every")
    }
    config = load_run_config(QUICKSTART, ["train.optimizer.learning_rate=0.01"])
    assert config.train.optimizer.learning_rate == 0.01
    assert config.train.optimizer.weight_decay == 0.05  # from quickstart.yaml, not reset


def test_a_recorded_cadence_writes_only_its_unit():
    """config.yaml reads back as the same single-unit cadence (no `steps: null` beside `epochs: 30`)."""
    dumped = load_run_config(QUICKSTART).model_dump(mode="json")["train"]
    assert dumped["length"] == {"epochs": 30}
    assert dumped["lr_schedule"]["warmup"] == {"fraction": 0.05}


@pytest.mark.parametrize(
    ("recorded", "migrated"),
    [
        ({"steps": 100, "epochs": 1}, {"steps": 100}),  # max_steps won over epochs
        ({"steps": None, "epochs": 3}, {"epochs": 3}),
        ({"steps": 0, "fraction": 0.1}, {"fraction": 0.1}),  # warmup_steps: 0 meant none
        ({"steps": 0, "fraction": None}, None),
        ({"steps": None, "epochs": None}, None),
        ({"epochs": 2.0}, {"epochs": 2.0}),  # this version's own record
    ],
)
def test_a_cadence_an_older_version_recorded_keeps_the_unit_in_effect(recorded, migrated):
    assert Cadence.migrate_recorded(recorded) == migrated
