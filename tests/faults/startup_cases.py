"""Fault cases: what a run does with bad input and interruptions around its start (non-finite values,
early signals, resuming past max_steps, a checkpoint without its manifest, a lock race)."""

from __future__ import annotations

from pathlib import Path

from faults.harness import case, cli, mlp, train_steps

# --- values -------------------------------------------------------------------------------------------


@case(
    "train.adam_epsilon=1e400 (reads as inf) and train.learning_rate=.nan",
    "both refused together as not finite, before anything is written (inf used to pass, train nothing "
    "and exit 0)",
)
def non_finite_floats_are_refused(tmp: Path) -> str:
    config, run = mlp(tmp)
    bad = cli("train", str(config), "train.adam_epsilon=1e400", "train.learning_rate=.nan")
    assert bad.rc == 1, bad.err[-2000:]
    for key in ("train.adam_epsilon: got inf", "train.learning_rate: got nan"):
        assert key in bad.err and "must be a finite number" in bad.err, bad.err
    assert not run.exists()
    return "exit 1, '2 problem(s)': adam_epsilon got inf, learning_rate got nan: must be a finite number"


# --- resuming -----------------------------------------------------------------------------------------


@case(
    "the newest checkpoint's manifest.json was deleted, then resume=latest",
    "`latest` names step_8 as incomplete (no manifest) and resumes from the verified step_4; an explicit "
    "train.resume of step_8 is refused (it used to be taken as an unverified pre-0.2 checkpoint)",
)
def a_checkpoint_without_its_manifest_is_skipped(tmp: Path) -> str:
    config, run = mlp(tmp, train={"max_steps": 8, "checkpoint_every": 4, "keep_last_checkpoints": 3})
    assert cli("train", str(config)).rc == 0
    step_4, step_8 = run / "checkpoints" / "step_4", run / "checkpoints" / "step_8"
    (step_8 / "manifest.json").unlink()
    explicit = cli("train", str(config), f"train.resume={step_8}", "train.max_steps=10")
    assert explicit.rc == 1 and "manifest.json is missing" in explicit.err, explicit.err[-2000:]
    latest = cli("train", str(config), "train.resume=latest", "train.max_steps=10")
    assert latest.rc == 0, latest.err[-3000:]
    skipped = next(line for line in latest.out.splitlines() if "skipped step_8" in line)
    assert "manifest.json is missing" in skipped and f"resumed from {step_4}" in latest.out, latest.out
    assert train_steps(run) == list(range(1, 11))
    return "explicit resume of step_8 refused; latest: 'skipped step_8: ... manifest.json is missing', step 4"


def _snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run directory with its content, except the lock a run takes while it is alive."""
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".framer_ds.lock"
    }


@case(
    "resume=latest from a step_8 checkpoint with train.max_steps=6",
    "refused naming both numbers and the fix; nothing in the run directory changes (it used to export "
    "final/ labelled as trained to step 6 from step-8 weights)",
)
def resuming_past_max_steps_is_refused(tmp: Path) -> str:
    config, run = mlp(tmp, train={"max_steps": 8, "checkpoint_every": 4})
    assert cli("train", str(config)).rc == 0
    before = _snapshot(run)
    short = cli("train", str(config), "train.resume=latest", "train.max_steps=6")
    assert short.rc == 1, short.err[-2000:]
    message = next(line for line in short.err.splitlines() if "train.max_steps" in line)
    assert "is 6" in message and "step 8" in message and "Set train.max_steps to 8 or more" in message
    assert _snapshot(run) == before
    return f"exit 1, '{message.strip().removeprefix('- ')[:90]}...'; run directory unchanged"
