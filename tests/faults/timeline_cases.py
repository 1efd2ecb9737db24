"""Fault cases: data loss, wrong timelines, and resumes that must tell the truth (see faults/cases.py)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from faults.harness import Result, case, cli, mlp, run_with_checkpoints_at_4_and_8, train_steps

from conftest import (
    read_metrics,
)

# --- data loss and wrong timelines -------------------------------------------------------------------


@case(
    "resume from step_6 while step_8 exists, checkpoint every step, checkpoint.keep_last=1",
    "the new step_7 is kept; the abandoned step_7, step_8 and final/ move to checkpoints/abandoned/; "
    "`latest` picks the new step_7",
)
def rollback_resume_keeps_the_new_timeline(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 8, "checkpoint.every.steps": 1, "checkpoint.keep_last": 10})
    assert cli("train", str(config)).rc == 0
    resumed = cli(
        "train",
        str(config),
        f"train.resume={run}/checkpoints/step_6",
        "train.length.steps=7",
        "train.checkpoint.keep_last=1",
    )
    assert resumed.rc == 0, resumed.err[-3000:]
    kept = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert kept == ["step_7"], kept
    (abandoned,) = (run / "checkpoints" / "abandoned").iterdir()
    assert sorted(p.name for p in abandoned.iterdir()) == ["final", "step_7", "step_8"]
    assert "holds the abandoned timeline" in resumed.out
    from framer_ds.engine.checkpoint import read_trainer_state
    from framer_ds.engine.resume.choice import choose_resume

    latest = choose_resume(run, "latest").path
    assert latest == run / "checkpoints" / "step_7" and read_trainer_state(latest).global_step == 7
    assert train_steps(run) == [1, 2, 3, 4, 5, 6, 7]
    where = abandoned.relative_to(run)
    return f"checkpoints/ holds {kept}; {where} holds step_7, step_8, final/; latest = step_7"


@case(
    "the process dies between moving the old final/ aside and moving the new one in",
    "the old final/ survives (renamed aside), never neither; the next export removes the leftover",
)
def replacing_final_never_leaves_neither(tmp: Path) -> str:
    from framer_ds.storage import atomic

    config, run = mlp(tmp, train={"length.steps": 4, "checkpoint.every.steps": 2})
    assert cli("train", str(config)).rc == 0
    old_weights = (run / "final" / "model.safetensors").read_bytes()
    real_replace = os.replace

    def crash_when_publishing_final(src, dst):
        if Path(dst).name == "final" and Path(src).name.startswith(".tmp_final"):
            raise OSError("simulated power loss between the two renames")
        real_replace(src, dst)

    atomic.os.replace = crash_when_publishing_final
    try:
        crashed = cli("train", str(config), "train.resume=latest", "train.length.steps=6")
    finally:
        atomic.os.replace = real_replace
    assert crashed.rc != 0
    (aside,) = run.glob(".old_final.*")
    assert (aside / "model.safetensors").read_bytes() == old_weights and not (run / "final").exists()
    again = cli("train", str(config), "train.resume=latest", "train.length.steps=6")
    assert again.rc == 0, again.err[-3000:]
    assert (run / "final" / "model.safetensors").is_file() and not list(run.glob(".old_final.*"))
    return f"after the crash: {aside.name}/ holds the old weights; the rerun published final/ and removed it"


@case(
    "the newest checkpoint is truncated; another holds a file that is not in its manifest",
    "`latest` skips step_8 naming the truncated file and resumes from step_4; an explicit "
    "train.resume of either is refused naming the file",
)
def damaged_checkpoints_are_named_and_skipped(tmp: Path) -> str:
    config, run, step_4, step_8 = run_with_checkpoints_at_4_and_8(tmp)
    weights = step_8 / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (step_4 / "evil.pkl").write_bytes(b"not written by the run")
    explicit = cli("train", str(config), f"train.resume={step_8}", "train.length.steps=10")
    assert explicit.rc == 1 and "model.safetensors" in explicit.err and "truncated" in explicit.err
    extra = cli("train", str(config), f"train.resume={step_4}", "train.length.steps=10")
    assert extra.rc == 1 and "evil.pkl is not in the manifest" in extra.err, extra.err[-2000:]
    (step_4 / "evil.pkl").unlink()
    latest = cli("train", str(config), "train.resume=latest", "train.length.steps=10")
    assert latest.rc == 0, latest.err[-3000:]
    assert "skipped step_8" in latest.out and f"resumed from {step_4}" in latest.out
    assert train_steps(run) == list(range(1, 11))
    return (
        "explicit resume refused (truncated model.safetensors; evil.pkl not in the manifest); "
        "latest skipped step_8 and resumed at step 4"
    )


@case(
    "the process dies while metrics.jsonl is cut back to the resume step",
    "metrics.jsonl keeps its whole history (the cut copy is written beside it and renamed)",
)
def metrics_rewrite_is_atomic(tmp: Path) -> str:
    from framer_ds.storage import atomic

    config, run = mlp(tmp, train={"length.steps": 4, "checkpoint.every.steps": 2, "checkpoint.keep_last": 3})
    assert cli("train", str(config)).rc == 0
    before = (run / "metrics.jsonl").read_text()
    real_fsync = atomic.fsync_path

    def die_before_the_rename(path):
        if ".metrics." in Path(path).name:
            raise KeyboardInterrupt("simulated kill during the metrics rewrite")
        real_fsync(path)

    atomic.fsync_path = die_before_the_rename
    try:
        killed = cli("train", str(config), f"train.resume={run}/checkpoints/step_2")
    except KeyboardInterrupt:
        killed = Result(-1, "", "")
    finally:
        atomic.fsync_path = real_fsync
    assert killed.rc != 0
    assert (run / "metrics.jsonl").read_text() == before
    assert not [p for p in run.iterdir() if p.name.startswith(".metrics")]
    return f"metrics.jsonl unchanged ({len(before.splitlines())} lines), no temp file left"


# --- resume tells the truth --------------------------------------------------------------------------


@case(
    "resume with train.optimizer.learning_rate halved",
    "applied (the LR curve continues at half) and logged as 'changed on resume'; config.yaml says so",
)
def a_new_learning_rate_is_applied(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 6, "checkpoint.every.steps": 2, "checkpoint.keep_last": 5})
    assert cli("train", str(config)).rc == 0
    original = {line["step"]: line["lr"] for line in read_metrics(run)[0]}
    resumed = cli(
        "train", str(config), f"train.resume={run}/checkpoints/step_2", "train.optimizer.learning_rate=5e-4"
    )
    assert resumed.rc == 0, resumed.err[-3000:]
    assert "changed on resume: train.optimizer.learning_rate: 0.001 -> 0.0005" in resumed.out
    after = {line["step"]: line["lr"] for line in read_metrics(run)[0]}
    for step in (3, 4, 5, 6):
        assert abs(after[step] - original[step] / 2) <= 1e-12, (step, after[step], original[step])
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["optimizer"]["learning_rate"] == 5e-4
    return f"lr at step 3: {original[3]:.3g} before, {after[3]:.3g} after; logged; config.yaml 0.0005"


@case(
    "resume with a new micro-batch size and a new data set size",
    "refused before training, both differences listed at once; nothing in the run directory changes",
)
def a_breaking_change_is_refused(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 4, "checkpoint.every.steps": 2})
    assert cli("train", str(config)).rc == 0
    before = (run / "metrics.jsonl").read_text()
    refused = cli(
        "train", str(config), "train.resume=latest", "train.micro_batch_size=4", "data.num_samples=256"
    )
    assert refused.rc == 1
    assert "train.micro_batch_size: 8 in the checkpoint, 4 now" in refused.err, refused.err[-2000:]
    assert "data.num_samples: 512 in the checkpoint, 256 now" in refused.err
    assert (run / "metrics.jsonl").read_text() == before
    allowed = cli(
        "train",
        str(config),
        "train.resume=latest",
        "data.num_samples=256",
        "train.resume_allow_changes=[data.num_samples]",
        "train.length.steps=5",
    )
    assert allowed.rc == 0, allowed.err[-2000:]
    return "exit 1 listing train.micro_batch_size 8 -> 4 and data.num_samples 512 -> 256; allowed when listed"


@case(
    "a checkpoint's random_states_0.pkl is missing",
    "the run resumes and warns that it is no longer exactly reproducible",
)
def missing_rng_state_resumes_with_a_warning(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 4, "checkpoint.every.steps": 2})
    assert cli("train", str(config)).rc == 0
    (run / "checkpoints" / "step_4" / "random_states_0.pkl").unlink()
    resumed = cli("train", str(config), "train.resume=latest", "train.length.steps=6")
    assert resumed.rc == 0, resumed.err[-3000:]
    assert "random_states_0.pkl is missing" in resumed.out and "no longer exactly reproducible" in resumed.out
    return "resumed at step 4 with: 'random_states_0.pkl is missing: ... no longer exactly reproducible'"
