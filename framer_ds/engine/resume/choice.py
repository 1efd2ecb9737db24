"""Which checkpoint a run continues from: `train.resume` null, `latest`, `best` or a path, checked by
manifest.

Why rank 0 decides: ranks choosing on their own could pick different checkpoints when their views of the
shared directory differ (a checkpoint being pruned, an NFS cache). `latest` skips a damaged or incomplete
checkpoint, naming it and why, and falls back to the newest that verifies. `best` is the checkpoint of the
best evaluation (`engine.checkpoint.best_checkpoint`); like any older path it starts a new timeline, the
newer checkpoints being set aside (engine/run_dir.py, `set_aside_newer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator

from framer_ds.config.errors import ConfigError, ConfigProblem, RunSetupError
from framer_ds.engine.best import BEST_RECORD, read_best_record
from framer_ds.engine.checkpoint import (
    STATE_FILE,
    best_checkpoint,
    checkpoints_root,
    complete_checkpoints,
    read_trainer_state,
)
from framer_ds.engine.manifest import Verification, verify_checkpoint
from framer_ds.engine.rank_zero import decided_by_rank_zero


@dataclass
class ResumeChoice:
    """The checkpoint a run continues from, and what the choice had to say about the others."""

    path: Path | None
    notes: list[str]


def verified(path: Path) -> Verification:
    """The manifest check plus a readable trainer_state.json (what the loop reads first)."""
    result = verify_checkpoint(path)
    if result.ok:
        try:
            read_trainer_state(path)
        except (OSError, ValueError, TypeError) as exc:
            result.problems.append(f"{path / STATE_FILE} is unreadable ({exc})")
    return result


def choose_resume(output_dir: Path, resume: str | None, best_metric: str | None = None) -> ResumeChoice:
    """`null` -> None; `latest` -> the newest checkpoint that verifies (each one skipped is named with
    its reason; None when there is none at all); `best` -> the checkpoint of the best evaluation, which
    must exist (RunSetupError naming why not; `best_metric`, the running config's, only words it) and
    verify; a path -> that checkpoint, which must verify.
    Reads every file of the chosen checkpoint once (sha256): run it on one process."""
    if resume is None:
        return ResumeChoice(None, [])
    if resume == "best":
        return _explicit(best_to_resume(Path(output_dir), best_metric))
    if resume != "latest":
        path = Path(resume)
        if not (path / STATE_FILE).is_file():
            hint = (
                "it is a best/ export: resume from its checkpoint with train.resume=best"
                if (path / BEST_RECORD).is_file()
                else "point it at output_dir/checkpoints/step_N or use train.resume=latest"
            )
            raise ConfigError(
                [
                    ConfigProblem(
                        "train.resume",
                        f"{path} is not a complete framer_ds checkpoint (no {STATE_FILE}); {hint}",
                    )
                ]
            )
        return _explicit(path)
    notes: list[str] = []
    candidates = complete_checkpoints(output_dir)
    for path in reversed(candidates):
        check = verified(path)
        if check.ok:
            return ResumeChoice(path, [*notes, *check.warnings])
        notes.append(f"skipped {path.name}: " + "; ".join(check.problems))
    if candidates:
        raise ConfigError(
            [ConfigProblem("train.resume", note) for note in notes]
            + [
                ConfigProblem(
                    "train.resume",
                    f"none of the {len(candidates)} checkpoints in {checkpoints_root(output_dir)} verifies; "
                    "restore one from a copy, or start again with --overwrite",
                )
            ]
        )
    return ResumeChoice(None, notes)


def _explicit(path: Path) -> ResumeChoice:
    """A checkpoint the user named (a path, or `best`): it must verify, there is no falling back."""
    check = verified(path)
    if not check.ok:
        fix = "resume from another checkpoint (train.resume=latest picks the newest that verifies)"
        raise ConfigError([ConfigProblem("train.resume", f"{p}; {fix}") for p in check.problems])
    return ResumeChoice(path, check.warnings)


def best_to_resume(output_dir: Path, best_metric: str | None) -> Path:
    """The best checkpoint, or one line saying why there is none and what to do instead."""
    best = best_checkpoint(output_dir)
    if best is not None:
        return best.path
    record = read_best_record(output_dir)
    if record is not None:
        why = (
            f"the best evaluation ({record.describe()}) came before every checkpoint in "
            f"{checkpoints_root(output_dir)}, so none holds it"
        )
    elif best_metric is None:
        why = (
            f"{output_dir} has no best/ and train.eval.best_metric is not set, so no evaluation is judged "
            "best: set train.eval.best_metric and train.eval.best_mode to keep one from now on"
        )
    else:
        why = (
            f"no evaluation has been judged by {best_metric} in {output_dir} yet (there is no "
            f"best/{BEST_RECORD})"
        )
    raise RunSetupError(
        f"train.resume=best: there is no best checkpoint: {why}; resume with train.resume=latest (the "
        "newest checkpoint) or train.resume=PATH (output_dir/checkpoints/step_N)"
    )


def decide_checkpoint(
    accelerator: Accelerator, output_dir: Path, resume: str | None, best_metric: str | None = None
) -> Path | None:
    """Rank 0 chooses (and verifies) the checkpoint and every rank gets its choice: ranks deciding on
    their own could pick different checkpoints when their views of the directory differ. Every rank."""

    def choose() -> str | None:
        picked = choose_resume(output_dir, resume, best_metric)
        for note in picked.notes:
            print(f"resume: {note}", flush=True)
        return str(picked.path) if picked.path is not None else None

    chosen = decided_by_rank_zero(accelerator, choose)
    return Path(chosen) if chosen is not None else None
