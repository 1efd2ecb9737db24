"""Small engine helpers: the DeepSpeed batch cast and the run directory on resume."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from framer_ds.engine.precision import to_compute_dtype
from framer_ds.engine.run_dir import drop_samples_after


def _accelerator(deepspeed: bool, precision: str = "bf16"):
    return SimpleNamespace(
        state=SimpleNamespace(deepspeed_plugin=object() if deepspeed else None), mixed_precision=precision
    )


def test_deepspeed_cast_keeps_the_named_conditioning_scalars() -> None:
    batch = {
        "pixel_values": torch.rand(2, 3, 4),
        "fps": torch.tensor([29.97, 7.0], dtype=torch.float64),
        "labels": torch.tensor([1, 2]),
        "video_id": ["a", "b"],
    }
    cast = to_compute_dtype(_accelerator(True), batch, frozenset({"fps"}))
    assert cast["pixel_values"].dtype == torch.bfloat16 and cast["labels"].dtype == torch.int64
    assert cast["fps"] is batch["fps"] and cast["video_id"] == ["a", "b"]
    assert to_compute_dtype(_accelerator(True), batch)["fps"].tolist() == [30.0, 7.0]  # what bf16 does
    assert to_compute_dtype(_accelerator(False), batch) is batch  # DDP: autocast, no cast


def test_resume_drops_samples_of_the_abandoned_steps(tmp_path) -> None:
    for name in ("step_5", "step_10", "step_15", "notes"):
        (tmp_path / name).mkdir()
    drop_samples_after(tmp_path, 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step_10", "step_5"]
    drop_samples_after(tmp_path / "absent", 0)  # no samples folder: nothing to do


def test_the_loop_takes_the_run_directory_as_one_object() -> None:
    """Issue 46: train/loop.py made five calls into engine/run_dir.py (check, claim, shared check,
    prepare, write config.yaml), their order kept in comments; it now takes one `RunDirectory`, as it
    takes resume as one `ResumePlan`."""
    import ast

    from conftest import REPO

    tree = ast.parse((REPO / "framer_ds" / "train" / "loop.py").read_text())
    imported = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "framer_ds.engine.run_dir"
        for alias in node.names
    ]
    assert imported == ["RunDirectory"]


def test_a_claimed_run_directory_is_released_however_the_run_ends(tmp_path) -> None:
    """The lock is held while the body runs and released when it raises: the next run on the directory
    claims it at once (no stale lock to wait out)."""
    import pytest

    from framer_ds.config.errors import RunSetupError
    from framer_ds.engine.run_dir import RunDirectory
    from framer_ds.engine.run_lock import LOCK_NAME

    config = SimpleNamespace(output_dir=str(tmp_path / "run"))
    accelerator = SimpleNamespace(is_main_process=True, num_processes=1)
    (tmp_path / "run").mkdir()
    run_dir = RunDirectory(config)
    with pytest.raises(RuntimeError, match="the run failed"), run_dir.claimed(accelerator):
        assert (tmp_path / "run" / LOCK_NAME).exists()
        with pytest.raises(RunSetupError), RunDirectory(config).claimed(accelerator):
            pass  # a second run on the directory while the first holds it
        raise RuntimeError("the run failed")
    with RunDirectory(config).claimed(accelerator):  # released: claimed again at once
        pass
