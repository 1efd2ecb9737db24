"""`model.train_mask_token` on a Framer base (issue 33 §2): Framer's mask_token trains full-rank (its own
learning rate optional), is saved in checkpoints and final/, written into the Framer and merged
exports, and a resumed run restores it exactly. Refused where it cannot act."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, train_in_process
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.video_lora.framer.conditioning import framer_conditioning
from framer_ds.tasks.video_lora.framer.export import MASK_TOKEN_FILE
from framer_ds.tasks.video_lora.framer.model import load_framer_unet
from framer_ds.tasks.video_lora.task import VideoLoraTask

pytestmark = pytest.mark.timeout(600)

CONFIGS = REPO / "configs" / "tasks" / "video_lora"
FRAMER_TINY = CONFIGS / "framer_tiny.yaml"
TOKEN_LR = 0.05  # 50x train.optimizer.learning_rate (1e-3): the token's own group


def test_the_flags_are_refused_where_they_cannot_act(tmp_path):
    with pytest.raises(ConfigError, match=r"has no mask_token .*set model\.base\.name: framer"):
        load_run_config(CONFIGS / "tiny.yaml", [f"output_dir={tmp_path}", "model.train_mask_token=true"])
    with pytest.raises(ConfigError, match=r"mask_token_lr is set but model\.train_mask_token is false"):
        load_run_config(FRAMER_TINY, [f"output_dir={tmp_path}", "model.mask_token_lr=0.01"])


def test_the_trained_token_replaces_the_missing_frames_and_gets_the_gradient(tmp_path):
    """At the start the trainable token equals the base's, so the model computes exactly what the frozen
    one does (the mask is 0/1: the replaced latents are the same floats); the loss reaches the token."""
    overrides = [f"output_dir={tmp_path / 'run'}", "model.base.train_modules=unet_lora", "data.tracks=null"]
    frozen_task = VideoLoraTask(load_run_config(FRAMER_TINY, overrides))
    frozen_task.prepare_data()
    frozen = frozen_task.build_model()
    trained_task = VideoLoraTask(load_run_config(FRAMER_TINY, [*overrides, "model.train_mask_token=true"]))
    model = trained_task.build_model()
    assert {n for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n} == {"mask_token"}
    torch.manual_seed(0)
    first, last = torch.randn(2, 1, 4, 8, 8)
    cond = framer_conditioning(first, last, model.mask_token_value, 4)
    inputs = {
        "sample": torch.cat([torch.randn(1, 4, 4, 8, 8), cond], dim=2),
        "timestep": torch.tensor([0.3]),
        "encoder_hidden_states": torch.randn(1, 2, 32),
        "added_time_ids": torch.tensor([[6.0, 127.0, 0.02]]),
    }
    out = model(**inputs)[0]
    with torch.no_grad():
        assert torch.equal(out, frozen(**inputs)[0])
    out.square().mean().backward()
    assert model.mask_token.grad is not None and model.mask_token.grad.abs().sum() > 0
    with torch.no_grad():  # another token changes the output: the UNet reads it on the missing frames
        model.mask_token.add_(1.0)
        assert not torch.equal(model(**inputs)[0], out)


def test_a_trained_token_is_exported_in_every_layout_and_resumes_exactly(tmp_path, capsys):
    from framer_ds.cli.main import main
    from video_resume_runs import COMMON, resumable_copy, trajectories

    token_options = ["model.train_mask_token=true", f"model.mask_token_lr={TOKEN_LR}"]
    light = ["model.base.train_modules=unet_lora", "data.tracks=null", *token_options]
    train_in_process(FRAMER_TINY, [f"output_dir={tmp_path / 'full'}", *COMMON, *light])
    final = tmp_path / "full" / "final"
    trained = load_file(final / MASK_TOKEN_FILE)["mask_token"]
    base_dir = VideoLoraTask(load_run_config(FRAMER_TINY, [f"output_dir={tmp_path}"])).family.framer_path()
    base = load_framer_unet(base_dir / "unet").mask_token.detach()
    assert trained.shape == base.shape and not torch.equal(trained, base)

    # the optimizer held the token in a group of its own at mask_token_lr / learning_rate of the main rate
    groups = torch.load(
        tmp_path / "full" / "checkpoints" / "step_2" / "optimizer.bin", map_location="cpu", weights_only=False
    )["param_groups"]
    assert len(groups) == 2 and groups[1]["lr_scale"] == pytest.approx(TOKEN_LR / 1e-3)
    assert groups[1]["lr"] == pytest.approx(groups[0]["lr"] * TOKEN_LR / 1e-3)  # same schedule, scaled

    # Framer layout and merged: the trained token in Framer's key; peft: the file beside the adapter
    for fmt in ("framer", "merged", "peft"):
        assert main(["export", str(final), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
    printed = capsys.readouterr().out
    assert "trained mask_token" in printed
    for unet_dir in (tmp_path / "framer" / "unet", tmp_path / "merged"):
        torch.testing.assert_close(load_framer_unet(unet_dir).mask_token.detach(), trained, rtol=0, atol=0)
    assert torch.equal(load_file(tmp_path / "peft" / MASK_TOKEN_FILE)["mask_token"], trained)

    # `framer-ds eval` loads the export into the model build_model makes: the trained token included
    task = VideoLoraTask(load_run_config(FRAMER_TINY, [f"output_dir={tmp_path / 'eval'}", *light]))
    model = task.build_model()
    task.load_export(model, final)
    assert torch.equal(model.mask_token.detach(), trained)

    # resume from step 2: the same losses, and the same token at the end, bit for bit
    resumed = resumable_copy(tmp_path / "full", tmp_path / "resumed")
    train_in_process(FRAMER_TINY, [f"output_dir={resumed}", *COMMON, *light, "train.resume=latest"])
    again, straight = trajectories(tmp_path / "full", resumed)
    assert again == straight
    assert torch.equal(load_file(resumed / "final" / MASK_TOKEN_FILE)["mask_token"], trained)
