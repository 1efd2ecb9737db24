"""What a full disk during a run's own writes says (`storage/disk_space.reporting_full_disk` does it).

Why here: the checkpoint's wording lives with the checkpoint (engine/checkpoint.py); these are the
other directories a training run publishes, `final/` and `best/` (staged as `.tmp_<name>`) and a
round of samples (`samples/step_N`), and what the user does next is the same for all of them: free
space and resume, which redoes the write (the stop checkpoint or the last checkpoint is untouched).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from framer_ds.storage.atomic import staging_dir
from framer_ds.storage.disk_space import reporting_full_disk, tree_bytes

RESUME_FIX = "Free space there and resume with train.resume=latest"


def reporting_full_disk_in_export(target: Path) -> AbstractContextManager[None]:
    """Around the publishing of an export directory (`final/`, `best/`): its staging directory is
    deleted on a full disk and an older `target` stays as it was (it is replaced only by a rename)."""
    target = Path(target)
    kept = f"{target.name}/ is kept as it was" if target.exists() else f"no {target.name}/ was written"
    needed = tree_bytes(target)  # the export it replaces: the best estimate of this one (0: unknown)
    return reporting_full_disk(target.parent, needed, staging_dir(target), kept=kept, fix=RESUME_FIX)


def reporting_full_disk_in_samples(samples: Path, step: int) -> AbstractContextManager[None]:
    """Around one round of samples, which a task writes under `samples/step_N/`: that round's folder is
    deleted on a full disk (it is incomplete); earlier rounds stay."""
    samples = Path(samples)
    earlier = sorted(samples.glob("step_*"), key=lambda p: p.stat().st_mtime) if samples.is_dir() else []
    return reporting_full_disk(
        samples,
        tree_bytes(earlier[-1]) if earlier else 0,  # the last round: the best estimate of this one
        samples / f"step_{step}",
        kept=f"the samples of earlier steps are kept; step_{step}'s were removed",
        fix=RESUME_FIX,
    )
