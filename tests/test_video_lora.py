"""The video_lora task on tiny random SVD components (saved with save_pretrained and loaded back the
way real weights are) and small mp4 clips written with PyAV."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from diffusers import UNetSpatioTemporalConditionModel
from peft import PeftModel
from safetensors.torch import load_file

from conftest import REPO, accelerate_launch_cmd, launch_env, read_metrics, strategy_launch_args
from framer_ds.config.loader import load_run_config
from framer_ds.data.synthetic_video import ensure_synthetic_clips
from framer_ds.tasks.video_lora.task import EXPORT_METADATA, VideoLoraTask
from framer_ds.tasks.video_lora.unet_lora import widen_conv_in
from framer_ds.train.loop import run_training

TINY = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
pytestmark = pytest.mark.timeout(600)


def tiny_config(tmp_path, *overrides):
    return load_run_config(TINY, [f"output_dir={tmp_path / 'run'}", *overrides])


@pytest.mark.slow
def test_tiny_interpolation_run_learns_and_exports_a_loadable_adapter(tmp_path):
    config = tiny_config(tmp_path, "train.max_steps=20", "train.eval_every=10", "train.checkpoint_every=10")
    run_training(config)
    run = tmp_path / "run"
    train_lines, eval_lines = read_metrics(run)
    assert len(train_lines) == 20 and all(isinstance(x["loss"], float) for x in train_lines)
    assert [x["step"] for x in eval_lines] == [10, 20]
    assert {"eval/loss", "eval/loss_sigma_0.259", "eval/loss_sigma_2.01", "eval/loss_sigma_15.7"} <= set(
        eval_lines[0]
    )
    # the deterministic held-out loss (fixed sigmas, fixed noise per clip) goes down
    assert eval_lines[1]["eval/loss"] < eval_lines[0]["eval/loss"]

    for step in (10, 20):  # every checkpoint carries a loadable adapter too
        saved = load_file(run / "checkpoints" / f"step_{step}" / "adapter" / "adapter_model.safetensors")
        assert saved and all(t.numel() > 0 for t in saved.values())
    final = run / "final"
    adapter = load_file(final / "adapter_model.safetensors")
    assert adapter and all(t.numel() > 0 for t in adapter.values())
    assert any("conv_in" in name for name in adapter)  # the widened input conv travels with the LoRA
    metadata = json.loads((final / EXPORT_METADATA).read_text())
    assert metadata["mode"] == "interpolation" and metadata["conv_in_extra_channels"] == 1

    # a plain diffusers + peft script: base UNet, widen conv_in, load the adapter
    task = VideoLoraTask(config)
    unet = UNetSpatioTemporalConditionModel.from_pretrained(task.svd_path(), subfolder="unet")
    widen_conv_in(unet)
    tuned = PeftModel.from_pretrained(unet, final)
    conv_in = tuned.base_model.model.conv_in.modules_to_save["default"]
    torch.testing.assert_close(conv_in.weight, adapter["base_model.model.conv_in.weight"])
    assert conv_in.weight[:, 8:].abs().sum() > 0  # the zero-initialised mask weights were trained

    # `framer-ds sample`: base + adapter -> an mp4 with the trained frame count and size
    from PIL import Image

    from framer_ds.cli.main import main

    for name, corner in (("first.png", 5), ("last.png", 35)):
        pixels = torch.zeros(64, 64, 3, dtype=torch.uint8)
        pixels[corner : corner + 20, corner : corner + 20] = 220
        Image.fromarray(pixels.numpy()).save(tmp_path / name)
    out = tmp_path / "sample.mp4"
    args = ["sample", str(final), "--image", str(tmp_path / "first.png"), "--out", str(out), "--steps", "3"]
    assert main(args) == 1  # an interpolation adapter needs the last frame too
    assert main([*args, "--last-image", str(tmp_path / "last.png")]) == 0
    import av

    with av.open(str(out)) as container:
        decoded = list(container.decode(video=0))
    assert len(decoded) == 4 and (decoded[0].width, decoded[0].height) == (64, 64)


def test_adapter_round_trip_gives_identical_unet_outputs(tmp_path):
    config = tiny_config(tmp_path)
    task = VideoLoraTask(config)
    task.prepare_data()
    model = task.build_model()
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))  # a "trained" adapter, not the init
    model.save_pretrained(tmp_path / "adapter")

    unet = UNetSpatioTemporalConditionModel.from_pretrained(task.svd_path(), subfolder="unet")
    reloaded = PeftModel.from_pretrained(widen_conv_in(unet), tmp_path / "adapter")
    sample = torch.randn(1, 4, 9, 8, 8)
    embeddings = torch.randn(1, 1, 32)
    time_ids = torch.tensor([[6.0, 127.0, 0.02]])
    with torch.no_grad():
        want = model(
            sample, torch.tensor([0.3]), encoder_hidden_states=embeddings, added_time_ids=time_ids
        ).sample
        got = reloaded(
            sample, torch.tensor([0.3]), encoder_hidden_states=embeddings, added_time_ids=time_ids
        ).sample
    torch.testing.assert_close(got, want)


def test_widened_conv_in_starts_as_the_pretrained_unet(tmp_path):
    task = VideoLoraTask(tiny_config(tmp_path))
    task.prepare_data()
    base = UNetSpatioTemporalConditionModel.from_pretrained(task.svd_path(), subfolder="unet")
    wide = widen_conv_in(UNetSpatioTemporalConditionModel.from_pretrained(task.svd_path(), subfolder="unet"))
    assert wide.config.in_channels == 9
    x = torch.randn(1, 4, 8, 8, 8)
    mask = torch.ones(1, 4, 1, 8, 8)
    kwargs = {
        "encoder_hidden_states": torch.randn(1, 1, 32),
        "added_time_ids": torch.tensor([[6.0, 127.0, 0.0]]),
    }
    with torch.no_grad():
        torch.testing.assert_close(
            wide(torch.cat([x, mask], 2), torch.tensor([0.1]), **kwargs).sample,
            base(x, torch.tensor([0.1]), **kwargs).sample,
        )


def test_corrupt_and_too_short_videos_are_skipped_and_reported(tmp_path):
    clips = ensure_synthetic_clips(tmp_path / "clips_src", count=4)
    root = tmp_path / "videos"
    shutil.copytree(clips, root)
    (root / "broken.mp4").write_bytes(b"not a video at all" * 50)
    from framer_ds.data.synthetic_video import write_moving_shape_clip

    write_moving_shape_clip(root / "short.mp4", frames=3, width=96, height=80, fps=12, seed=9)
    task = VideoLoraTask(tiny_config(tmp_path, "data.builtin=null", f"data.root={root}"))
    index = task._index()
    assert len(index.records) == 4
    reasons = {path.name: reason for path, reason in index.rejected}
    assert set(reasons) == {"broken.mp4", "short.mp4"}
    assert "too short" in reasons["short.mp4"]


@pytest.mark.distributed
def test_zero3_two_process_run_saves_a_complete_adapter(tmp_path):
    """ZeRO-3 with every parameter partitioned and released after use: the adapter is still complete."""
    config_args = [
        f"output_dir={tmp_path / 'run'}",
        "train.max_steps=2",
        "train.eval_every=null",
        "train.checkpoint_every=2",
        "data.val_fraction=0",
    ]
    cmd = accelerate_launch_cmd(
        *strategy_launch_args("zero3", tmp_path), "-m", "framer_ds", "train", str(TINY), *config_args
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-5000:]
    for adapter_dir in (tmp_path / "run" / "final", tmp_path / "run" / "checkpoints" / "step_2" / "adapter"):
        adapter = load_file(adapter_dir / "adapter_model.safetensors")
        empty = [name for name, t in adapter.items() if t.numel() == 0]
        assert adapter and not empty, (adapter_dir, empty)


def test_data_check_prints_the_report_and_fails_on_unusable_data(tmp_path, capsys):
    from framer_ds.cli.main import main

    root = tmp_path / "videos"
    shutil.copytree(ensure_synthetic_clips(tmp_path / "clips_src", count=3), root)
    (root / "broken.mp4").write_bytes(b"garbage" * 100)
    args = [
        "data",
        "check",
        str(TINY),
        f"output_dir={tmp_path / 'run'}",
        "data.builtin=null",
        f"data.root={root}",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "usable: 3, rejected: 1" in out and "broken.mp4" in out and "96x80" in out

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "only_broken.mp4").write_bytes(b"garbage" * 100)
    assert main([*args[:-1], f"data.root={empty}"]) == 1
    err = capsys.readouterr().err
    assert "only_broken.mp4" in err and "data.root: none of the" in err
