"""Which checkpoint a run continues from: `train.resume` null, `latest` or a path, checked by manifest.

Why rank 0 decides: ranks choosing on their own could pick different checkpoints when their views of the
shared directory differ (a checkpoint being pruned, an NFS cache). `latest` skips a damaged or incomplete
checkpoint, naming it and why, and falls back to the newest that verifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.checkpoint import STATE_FILE, checkpoints_root, complete_checkpoints, read_trainer_state
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


def choose_resume(output_dir: Path, resume: str | None) -> ResumeChoice:
    """`null` -> None; `latest` -> the newest checkpoint that verifies (each one skipped is named with
    its reason; None when there is none at all); a path -> that checkpoint, which must verify.
    Reads every file of the chosen checkpoint once (sha256): run it on one process."""
    if resume is None:
        return ResumeChoice(None, [])
    if resume != "latest":
        path = Path(resume)
        if not (path / STATE_FILE).is_file():
            raise ConfigError(
                [
                    ConfigProblem(
                        "train.resume",
                        f"{path} is not a complete framer_ds checkpoint (no {STATE_FILE}); point it at "
                        "output_dir/checkpoints/step_N or use train.resume=latest",
                    )
                ]
            )
        check = verified(path)
        if not check.ok:
            fix = "resume from another checkpoint (train.resume=latest picks the newest that verifies)"
            raise ConfigError([ConfigProblem("train.resume", f"{p}; {fix}") for p in check.problems])
        return ResumeChoice(path, check.warnings)
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


def decide_checkpoint(accelerator: Accelerator, output_dir: Path, resume: str | None) -> Path | None:
    """Rank 0 chooses (and verifies) the checkpoint and every rank gets its choice: ranks deciding on
    their own could pick different checkpoints when their views of the directory differ. Every rank."""

    def choose() -> str | None:
        picked = choose_resume(output_dir, resume)
        for note in picked.notes:
            print(f"resume: {note}", flush=True)
        return str(picked.path) if picked.path is not None else None

    chosen = decided_by_rank_zero(accelerator, choose)
    return Path(chosen) if chosen is not None else None
