"""What a resumed run's config may change from the checkpoint's (`engine/resume/changes.py`): the model,
the data, its order and position are refused (all differences at once) unless listed in
`train.resume_allow_changes`; the rest is applied and listed; accumulation may change with the world size
when the global batch stays; a checkpoint past `train.length.steps` is refused. No training: a checkpoint
here is the resolved config.yaml a real one carries."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import mlp_config
from framer_ds.config.errors import ConfigError
from framer_ds.config.loader import dump_run_config
from framer_ds.engine.checkpoint import CHECKPOINT_CONFIG, TrainerState
from framer_ds.engine.resume.changes import resume_changes
from framer_ds.tasks.run_config import load_run_config


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, Path]:
    """(the run's YAML, a checkpoint at step 8 holding the resolved config it was written with)."""
    path = mlp_config(tmp_path / "mlp.yaml", tmp_path / "run")
    step_8 = tmp_path / "run" / "checkpoints" / "step_8"
    step_8.mkdir(parents=True)
    (step_8 / CHECKPOINT_CONFIG).write_text(dump_run_config(load_run_config(path)))
    return path, step_8


def changes(recorded, *overrides: str, old_world: int = 1, new_world: int = 1) -> list[str]:
    path, step_8 = recorded
    state = TrainerState(global_step=8, world_size=old_world)
    return resume_changes(
        step_8, load_run_config(path, ["train.resume=latest", *overrides]), state, new_world
    )


def test_the_same_config_changes_nothing(recorded):
    assert changes(recorded) == []


def test_a_harmless_change_is_applied_and_listed(recorded):
    assert changes(recorded, "train.optimizer.learning_rate=0.0005") == [
        "train.optimizer.learning_rate: 0.001 -> 0.0005"
    ]


def test_changes_of_meaning_are_refused_all_at_once(recorded):
    with pytest.raises(ConfigError) as refused:
        changes(recorded, "train.micro_batch_size=4", "train.seed=8", "train.optimizer.learning_rate=0.0005")
    where = [p.where for p in refused.value.problems]
    assert where == ["train.micro_batch_size", "train.seed", "train.resume"]
    assert "train.resume_allow_changes" in refused.value.problems[-1].message


def test_an_allowed_change_is_applied(recorded):
    lines = changes(recorded, "data.num_samples=256", "train.resume_allow_changes=[data.num_samples]")
    assert lines == ["data.num_samples: 512 -> 256"]


def test_accumulation_may_follow_the_world_size_when_the_global_batch_stays(recorded):
    # 8 x 2 x 1 process before, 8 x 1 x 2 processes now: 16 samples per optimizer step both times.
    lines = changes(recorded, "train.gradient_accumulation_steps=1", old_world=1, new_world=2)
    assert lines == [
        "train.gradient_accumulation_steps: 2 -> 1 (the global batch stays the same at the new number of "
        "processes)"
    ]
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        changes(recorded, "train.gradient_accumulation_steps=1")  # same world size: the batch halves


def test_a_checkpoint_past_max_steps_is_refused(recorded):
    with pytest.raises(ConfigError) as refused:
        changes(recorded, "train.length.steps=6")
    assert [p.where for p in refused.value.problems] == ["train.length.steps"]
    assert "Set train.length.steps to 8 or more" in str(refused.value)


def test_a_checkpoint_without_its_config_is_not_checked_and_says_so(recorded):
    (recorded[1] / CHECKPOINT_CONFIG).unlink()
    assert changes(recorded, "train.seed=8") == [
        f"(no {CHECKPOINT_CONFIG} in {recorded[1]}: written before framer_ds 0.2, changes not checked)"
    ]
