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
