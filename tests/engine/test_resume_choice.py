"""Which checkpoint a run resumes (`engine/resume/choice.py`): `null`, `latest` falling back over damaged
or incomplete checkpoints (each named with its reason), `best` (the checkpoint of best/best.json), an
explicit path that must verify. Checkpoints
here are a trainer_state.json and one payload file under a real manifest: only the choice is exercised.
The same rules end to end, with real runs, are the fault cases `damaged_checkpoints_are_named_and_skipped`
and `a_checkpoint_without_its_manifest_is_skipped`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from framer_ds.config.errors import ConfigError, RunSetupError
from framer_ds.engine.checkpoint import STATE_FILE, TrainerState
from framer_ds.engine.manifest import MANIFEST_NAME, write_manifest
from framer_ds.engine.resume.choice import choose_resume


def checkpoint(run: Path, step: int, manifest: bool = True) -> Path:
    path = run / "checkpoints" / f"step_{step}"
    path.mkdir(parents=True)
    (path / STATE_FILE).write_text(json.dumps(asdict(TrainerState(global_step=step))))
    (path / "model.safetensors").write_bytes(bytes(range(64)))
    if manifest:
        write_manifest(path)
    return path


def damage(path: Path) -> None:
    """Same size, other bytes: only the sha256 can tell."""
    (path / "model.safetensors").write_bytes(bytes(reversed(range(64))))


def test_no_resume_and_no_checkpoint_start_fresh(tmp_path):
    assert choose_resume(tmp_path, None).path is None
    assert choose_resume(tmp_path, "latest").path is None and choose_resume(tmp_path, "latest").notes == []
    checkpoint(tmp_path, 4)
    assert choose_resume(tmp_path, None).path is None  # resume not asked for: a checkpoint is not used


def test_latest_falls_back_over_damaged_and_incomplete_checkpoints_naming_each(tmp_path):
    good = checkpoint(tmp_path, 4)
    damage(checkpoint(tmp_path, 8))
    checkpoint(tmp_path, 12, manifest=False)
    choice = choose_resume(tmp_path, "latest")
    assert choice.path == good
    assert [note.split(":")[0] for note in choice.notes] == ["skipped step_12", "skipped step_8"]
    assert MANIFEST_NAME in choice.notes[0] and "missing" in choice.notes[0]
    assert "model.safetensors" in choice.notes[1]


def test_an_explicit_path_must_verify(tmp_path):
    good, bad = checkpoint(tmp_path, 4), checkpoint(tmp_path, 8)
    damage(bad)
    assert choose_resume(tmp_path, str(good)).path == good
    with pytest.raises(ConfigError) as refused:
        choose_resume(tmp_path, str(bad))
    assert {p.where for p in refused.value.problems} == {"train.resume"}
    assert "train.resume=latest" in str(refused.value)
    with pytest.raises(ConfigError, match="not a complete framer_ds checkpoint"):
        choose_resume(tmp_path, str(tmp_path / "checkpoints"))


def test_latest_with_no_checkpoint_that_verifies_is_refused_listing_every_one(tmp_path):
    damage(checkpoint(tmp_path, 4))
    checkpoint(tmp_path, 8, manifest=False)
    with pytest.raises(ConfigError) as refused:
        choose_resume(tmp_path, "latest")
    messages = [p.message for p in refused.value.problems]
    assert len(messages) == 3 and "none of the 2 checkpoints" in messages[-1]


def best_json(run: Path, step: int, value: float = 0.25) -> None:
    """best/best.json as KeepBest writes it (train/actions.py)."""
    (run / "best").mkdir(parents=True, exist_ok=True)
    record = {"step": step, "metric": "eval/loss", "value": value, "mode": "min"}
    (run / "best" / "best.json").write_text(json.dumps(record))


@pytest.mark.parametrize(("best_step", "chosen"), [(8, 8), (10, 8), (12, 12)])
def test_best_is_the_newest_checkpoint_at_or_before_the_best_evaluation(tmp_path, best_step, chosen):
    for step in (4, 8, 12, 16):
        checkpoint(tmp_path, step)
    best_json(tmp_path, best_step)
    assert choose_resume(tmp_path, "best", "eval/loss").path == tmp_path / "checkpoints" / f"step_{chosen}"


def test_best_must_verify(tmp_path):
    damage(checkpoint(tmp_path, 4))
    checkpoint(tmp_path, 8)
    best_json(tmp_path, 4)
    with pytest.raises(ConfigError) as refused:  # no falling back to another: best names one checkpoint
        choose_resume(tmp_path, "best", "eval/loss")
    assert "model.safetensors" in str(refused.value)


@pytest.mark.parametrize(
    ("best_metric", "best_step", "why"),
    [
        (None, None, "has no best/ and train.eval.best_metric is not set"),
        ("eval/loss", None, "no evaluation has been judged by eval/loss in"),
        ("eval/loss", 2, "the best evaluation (eval/loss=0.25 at step 2) came before every checkpoint"),
    ],
)
def test_no_best_checkpoint_is_one_line_naming_why_and_the_fix(tmp_path, best_metric, best_step, why):
    checkpoint(tmp_path, 4)
    if best_step is not None:
        best_json(tmp_path, best_step)
    with pytest.raises(RunSetupError) as refused:
        choose_resume(tmp_path, "best", best_metric)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("train.resume=best: there is no best checkpoint: ")
    assert why in message and "resume with train.resume=latest" in message


def test_a_best_export_given_as_a_path_points_at_resume_best(tmp_path):
    checkpoint(tmp_path, 4)
    best_json(tmp_path, 4)
    with pytest.raises(
        ConfigError, match=r"it is a best/ export: resume from its checkpoint with train\.resume=best"
    ):
        choose_resume(tmp_path, str(tmp_path / "best"))
