"""Fault cases: many runs racing for one run directory, and a run resumed onto its own trajectory."""

from __future__ import annotations

from pathlib import Path

from faults.harness import case


@case(
    "12 runs start on one output_dir at once, 15 ms apart, where flock is unavailable (heartbeat lock) and "
    "reads answer 50 ms late; on an empty directory and over a stale lock",
    "exactly one holds the lock each time (an exclusive create decides; the old write-sleep-reread "
    "let 2-3 win)",
)
def of_many_newcomers_exactly_one_wins_the_heartbeat_lock(tmp: Path) -> str:
    from faults.test_run_lock import newcomers_at_once

    found = {}
    for stale in (False, True):
        run_dir = tmp / ("stale" if stale else "empty")
        run_dir.mkdir()
        found[stale] = newcomers_at_once(run_dir, stale)
        assert found[stale] == 1, f"{found[stale]} of 12 newcomers hold the lock (stale lock: {stale})"
    return "1 of 12 holds it on an empty directory, 1 of 12 over a stale lock"


@case(
    "video_lora (tiny SVD) stopped after its step-2 checkpoint and resumed with train.resume=latest "
    "(and 2 loader workers)",
    "steps 3-5 repeat the uninterrupted run's losses exactly (they differed by up to 0.5)",
)
def video_lora_resumes_onto_its_own_trajectory(tmp: Path) -> str:
    from video_resume_runs import STEPS, resumed_and_straight_losses

    again, straight = resumed_and_straight_losses("svd", tmp)
    assert again == straight, f"resumed {again} vs uninterrupted {straight}"
    return f"steps 3-{STEPS}: losses {', '.join(f'{loss:.4f}' for _, loss, _ in again)} in both runs"
