"""An exported-looking video_lora adapter made directly with peft, without a training run: shared by
tests/tasks/video_lora/test_export_formats.py and the fault matrix's export cases (here, at the tests'
root, so a case imports it whatever else pytest collected)."""

from __future__ import annotations

import json

import torch
from diffusers import UNetSpatioTemporalConditionModel
from peft import LoraConfig, get_peft_model

from conftest import REPO
from framer_ds.engine.export import write_export_record
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.video_lora.config import ATTENTION_TARGETS, FEED_FORWARD_TARGETS, PROJECTION_TARGETS
from framer_ds.tasks.video_lora.inference import EXPORT_METADATA
from framer_ds.tasks.video_lora.models.tiny_svd import create_tiny_svd
from framer_ds.tasks.video_lora.unet_lora import widen_conv_in

TINY = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
RANK, ALPHA = 4, 11.0


def make_adapter(tmp_path, mode: str = "image_to_video"):
    """An exported-looking adapter directory (adapter + metadata + export record) and the base path."""
    svd = create_tiny_svd(default_cache_dir() / "tiny_svd")
    config = load_run_config(TINY, [f"output_dir={tmp_path / 'run'}", f"model.base.mode={mode}"])
    unet = UNetSpatioTemporalConditionModel.from_pretrained(svd, subfolder="unet")
    if mode == "interpolation":
        widen_conv_in(unet)
    lora = LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        target_modules=ATTENTION_TARGETS + FEED_FORWARD_TARGETS + PROJECTION_TARGETS,
        init_lora_weights=False,  # random lora_B: a non-zero delta to compare
        modules_to_save=["conv_in"] if mode == "interpolation" else None,
    )
    torch.manual_seed(0)
    adapter_dir = tmp_path / "final"
    get_peft_model(unet, lora).save_pretrained(adapter_dir)
    metadata = {
        "base_model": str(svd),
        "mode": mode,
        "conv_in_extra_channels": 1 if mode == "interpolation" else 0,
        "num_frames": 4,
        "height": 64,
        "width": 64,
        "fps": 6.0,
        "motion_bucket_id": 127,
    }
    (adapter_dir / EXPORT_METADATA).write_text(json.dumps(metadata))
    write_export_record(adapter_dir, "video_lora", config.model_dump(mode="json"))
    return adapter_dir, svd
