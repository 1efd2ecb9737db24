"""A Framer checkpoint as the base model (`model.base.name: framer`): Framer's layout loads strictly into
the stock diffusers UNet + `mask_token` and our ControlNet-SVD, the ControlNet residuals enter where
Framer's UNet adds them, Framer's conditioning convention, the training modes, the adapter and the
`framer` export.

Framer's semantics are taken from aim-uofa/Framer (models_diffusers/unet_spatio_temporal_condition.py,
models_diffusers/controlnet_svd.py, pipelines/pipeline_stable_video_diffusion_interp_control.py) and
ComfyUI-FramerWrapper (configs/*.json); the references below restate them with diffusers' modules."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from diffusers import UNetSpatioTemporalConditionModel
from peft import PeftModel
from safetensors.torch import load_file, save_file

from conftest import REPO, accelerate_launch_cmd, launch_env, read_metrics, strategy_launch_args
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.video_lora.framer.conditioning import (
    framer_conditioning,
    framer_dropout,
    framer_image_embeddings,
)
from framer_ds.tasks.video_lora.framer.controlnet import ControlNetSVDModel
from framer_ds.tasks.video_lora.framer.model import (
    FramerModel,
    add_mask_token,
    load_framer_controlnet,
    load_framer_unet,
)
from framer_ds.tasks.video_lora.framer.tiny import create_tiny_framer
from framer_ds.tasks.video_lora.svd.tiny import create_tiny_svd
from framer_ds.tasks.video_lora.task import VideoLoraTask

FRAMER_TINY = REPO / "configs" / "tasks" / "video_lora" / "framer_tiny.yaml"
pytestmark = pytest.mark.timeout(600)

# ComfyUI-FramerWrapper's configs/controlnet_config.json: the framer_512x320 ControlNet.
FRAMER_CONTROLNET_CONFIG = {
    "addition_time_embed_dim": 256,
    "block_out_channels": [320, 640, 1280, 1280],
    "conditioning_channels": 3,
    "conditioning_embedding_out_channels": [16, 32, 96, 256],
    "cross_attention_dim": 1024,
    "down_block_types": ["CrossAttnDownBlockSpatioTemporal"] * 3 + ["DownBlockSpatioTemporal"],
    "feature_channels": 160,
    "feature_out_channels": [160, 160, 256, 256],
    "in_channels": 9,
    "layers_per_block": 2,
    "num_attention_heads": [5, 10, 20, 20],
    "num_frames": 25,
    "out_channels": 4,
    "projection_class_embeddings_input_dim": 768,
    "sample_size": 96,
    "transformer_layers_per_block": 1,
    "up_block_types": ["UpBlockSpatioTemporal"] + ["CrossAttnUpBlockSpatioTemporal"] * 3,
    "with_id_feature": False,
}


@pytest.fixture(scope="module")
def framer_dir(tmp_path_factory):
    svd = create_tiny_svd(tmp_path_factory.mktemp("svd") / "tiny-svd")
    return create_tiny_framer(tmp_path_factory.mktemp("framer") / "tiny-framer", svd)


def unet_inputs(batch=1, frames=4, seq=2):
    torch.manual_seed(3)
    return {
        "sample": torch.randn(batch, frames, 9, 8, 8),
        "timestep": torch.tensor([0.3]),
        "encoder_hidden_states": torch.randn(batch, seq, 32),
        "added_time_ids": torch.tensor([[6.0, 127.0, 0.02]]).expand(batch, -1),
    }


def heatmaps(batch=1, frames=4):
    return (torch.rand(batch, frames, 3, 64, 64) * 255).round()


def framer_unet_forward(unet, sample, timestep, encoder_hidden_states, added_time_ids, down, mid):
    """Framer's UNet forward with ControlNet residuals, restated from its source: the residuals are added
    to the skip connections after ALL down blocks ran, and to the mid block's output."""
    b, f = sample.shape[:2]
    emb = unet.time_embedding(unet.time_proj(timestep.expand(b)).to(sample.dtype))
    time_embeds = unet.add_time_proj(added_time_ids.flatten()).reshape(b, -1)
    emb = (emb + unet.add_embedding(time_embeds)).repeat_interleave(f, 0)
    states = encoder_hidden_states.repeat_interleave(f, 0)
    indicator = torch.zeros(b, f)
    x = unet.conv_in(sample.flatten(0, 1))
    skips = (x,)
    for block in unet.down_blocks:
        kwargs = {"hidden_states": x, "temb": emb, "image_only_indicator": indicator}
        if getattr(block, "has_cross_attention", False):
            kwargs["encoder_hidden_states"] = states
        x, res = block(**kwargs)
        skips += res
    skips = tuple(s + r for s, r in zip(skips, down, strict=True))
    x = unet.mid_block(
        hidden_states=x, temb=emb, encoder_hidden_states=states, image_only_indicator=indicator
    )
    x = x + mid
    for block in unet.up_blocks:
        res, skips = skips[-len(block.resnets) :], skips[: -len(block.resnets)]
        kwargs = {"hidden_states": x, "temb": emb, "res_hidden_states_tuple": res}
        if getattr(block, "has_cross_attention", False):
            kwargs["encoder_hidden_states"] = states
        x = block(**kwargs, image_only_indicator=indicator)
    x = unet.conv_out(unet.conv_act(unet.conv_norm_out(x)))
    return x.reshape(b, f, *x.shape[1:])


def test_framer_layout_loads_strictly_with_framers_key_names(framer_dir, tmp_path):
    unet = load_framer_unet(framer_dir / "unet")
    controlnet = load_framer_controlnet(framer_dir / "controlnet")
    # Framer's UNet = the stock diffusers UNet with 9 input channels + a root `mask_token` [1,1,4,1,1]
    stock = UNetSpatioTemporalConditionModel.from_config({**dict(unet.config), "in_channels": 9})
    assert set(unet.state_dict()) == set(stock.state_dict()) | {"mask_token"}
    assert unet.mask_token.shape == (1, 1, 4, 1, 1) and unet.conv_in.in_channels == 9
    saved = load_file(framer_dir / "unet" / "diffusion_pytorch_model.safetensors")
    torch.testing.assert_close(unet.mask_token, saved["mask_token"])
    assert not any(p.is_meta for p in [*unet.parameters(), *controlnet.parameters()])
    assert {k.split(".")[0] for k in controlnet.state_dict()} == {
        "conv_in",
        "time_embedding",
        "add_embedding",
        "controlnet_cond_embedding",
        "down_blocks",
        "controlnet_down_blocks",
        "mid_block",
        "controlnet_mid_block",
    }
    # a key too many or too few is refused, naming it
    state = load_file(framer_dir / "unet" / "diffusion_pytorch_model.safetensors")
    broken = tmp_path / "unet"
    broken.mkdir()
    (broken / "config.json").write_text((framer_dir / "unet" / "config.json").read_text())
    save_file({**state, "extra.weight": torch.zeros(1)}, broken / "diffusion_pytorch_model.safetensors")
    with pytest.raises(ValueError, match=r"unexpected keys \['extra.weight'\]"):
        load_framer_unet(broken)
    del state["mask_token"]
    save_file(state, broken / "diffusion_pytorch_model.safetensors")
    with pytest.raises(ValueError, match=r"missing keys \['mask_token'\]"):
        load_framer_unet(broken)
    # a release stored in fp16 loads as fp32 (the values the file holds), as diffusers loads SVD
    half = load_file(framer_dir / "unet" / "diffusion_pytorch_model.safetensors")
    save_file({k: v.half() for k, v in half.items()}, broken / "diffusion_pytorch_model.safetensors")
    upcast = load_framer_unet(broken)
    assert {p.dtype for p in upcast.parameters()} == {torch.float32}
    torch.testing.assert_close(upcast.mask_token, half["mask_token"].half().float(), rtol=0, atol=0)


def test_controlnet_matches_framers_release_shapes():
    """The framer_512x320 ControlNet config builds Framer's parameter layout: 12 skip convs (conv_in + 3
    blocks x (2 resnets + downsampler) + 2 resnets), the heatmap embedding 3 -> 16 -> ... -> 320."""
    with torch.device("meta"):
        controlnet = ControlNetSVDModel.from_config(FRAMER_CONTROLNET_CONFIG)
    shapes = {k: tuple(v.shape) for k, v in controlnet.state_dict().items()}
    assert len(controlnet.controlnet_down_blocks) == 12
    assert shapes["conv_in.weight"] == (320, 9, 3, 3)
    assert shapes["controlnet_cond_embedding.conv_in.weight"] == (16, 3, 3, 3)
    assert shapes["controlnet_cond_embedding.blocks.5.weight"] == (256, 96, 3, 3)
    assert shapes["controlnet_cond_embedding.conv_out.weight"] == (320, 256, 3, 3)
    assert shapes["controlnet_down_blocks.11.weight"] == (1280, 1280, 1, 1)
    assert shapes["controlnet_mid_block.weight"] == (1280, 1280, 1, 1)
    with torch.device("meta"):
        unet = UNetSpatioTemporalConditionModel(in_channels=9)
    for name in ("down_blocks", "mid_block", "time_embedding", "add_embedding"):  # the UNet's encoder
        want = {k: tuple(v.shape) for k, v in getattr(unet, name).state_dict().items()}
        assert {k[len(name) + 1 :]: v for k, v in shapes.items() if k.startswith(name + ".")} == want


def test_residuals_enter_where_framers_unet_adds_them(framer_dir):
    unet = load_framer_unet(framer_dir / "unet")
    controlnet = load_framer_controlnet(framer_dir / "controlnet")
    model = FramerModel(unet, controlnet, unet.mask_token)
    inputs, cond = unet_inputs(), heatmaps()
    with torch.no_grad():
        down, mid = controlnet(**inputs, controlnet_cond=cond, conditioning_scale=0.7)
        want = framer_unet_forward(unet, **inputs, down=down, mid=mid)
        got = model(**inputs, controlnet_cond=cond, conditioning_scale=0.7)[0]
        plain = unet(**inputs, return_dict=False)[0]
        without = model(**inputs)[0]  # no heatmaps: the ControlNet is skipped (Framer: with_control=False)
    torch.testing.assert_close(got, want)
    assert (got - plain).abs().max() > 1e-3  # the tiny release's ControlNet does change the output
    torch.testing.assert_close(without, plain)
    with torch.no_grad():  # the hooks hold nothing after a call
        torch.testing.assert_close(unet(**inputs, return_dict=False)[0], plain)


def test_zero_initialised_controlnet_changes_nothing(framer_dir):
    unet = load_framer_unet(framer_dir / "unet")
    model = FramerModel(unet, ControlNetSVDModel.from_unet(unet), unet.mask_token)
    inputs = unet_inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            model(**inputs, controlnet_cond=heatmaps())[0], unet(**inputs, return_dict=False)[0]
        )


def test_framer_conditioning_convention():
    first, last = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    token = torch.randn(1, 1, 4, 1, 1)
    cond = framer_conditioning(first, last, token, 5)
    assert cond.shape == (2, 5, 5, 8, 8)
    torch.testing.assert_close(cond[:, 0, :4], first)
    torch.testing.assert_close(cond[:, -1, :4], last)
    torch.testing.assert_close(cond[:, 1:-1, :4], token.expand(2, 3, 4, 8, 8))
    assert cond[:, 1:-1, 4].eq(1).all() and cond[:, [0, -1], 4].eq(0).all()  # 1 on the MISSING frames
    emb = framer_image_embeddings(torch.randn(2, 1, 32), torch.randn(2, 1, 32))
    assert emb.shape == (2, 2, 32)
    # the unconditional half: zero first/last and zero embeddings for both; token and mask unchanged
    f0, l0, e0 = framer_dropout(first, last, emb, 1.0, 1.0)
    uncond = framer_conditioning(f0, l0, token, 5)
    assert e0.eq(0).all() and uncond[:, [0, -1], :4].eq(0).all()
    torch.testing.assert_close(uncond[:, 1:-1], cond[:, 1:-1])
    f1, l1, e1 = framer_dropout(first, last, emb, 0.0, 0.0)
    assert torch.equal(f1, first) and torch.equal(l1, last) and torch.equal(e1, emb)


def framer_task(tmp_path, *overrides):
    config = load_run_config(FRAMER_TINY, [f"output_dir={tmp_path / 'run'}", *overrides])
    task = VideoLoraTask(config)
    task.prepare_data()
    return task


@pytest.mark.parametrize("modes", ["unet_lora", "controlnet", "both"])
def test_training_modes_give_gradients_only_to_what_trains(tmp_path, modes):
    task = framer_task(tmp_path, f"model.base.train_modules={modes}")
    model = task.build_model()
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    lora = {n for n in trainable if "lora_" in n}
    control = {n for n in trainable if n.startswith("controlnet.")}
    assert trainable == lora | control
    assert bool(lora) == (modes != "controlnet")
    every_controlnet_param = {n for n, _ in model.controlnet.named_parameters(prefix="controlnet")}
    assert control == (every_controlnet_param if modes != "unet_lora" else set())
    assert not any("mask_token" in n for n in trainable)  # Framer's token stays as released
    inputs = unet_inputs(batch=2)
    model(**inputs, controlnet_cond=heatmaps(batch=2))[0].square().mean().backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad <= trainable
    assert bool(with_grad & control) == (modes != "unet_lora")
    assert bool(with_grad & lora) == (modes != "controlnet")


def test_adapter_loads_with_peft_on_a_fresh_framer_unet(tmp_path):
    task = framer_task(tmp_path)
    model = task.build_model()
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    model.unet.save_pretrained(tmp_path / "adapter")
    targets = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["target_modules"]
    assert set(targets) == {"to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out"} | {
        "ff.net.0.proj",
        "ff.net.2",
    }
    # "Framer's UNet class": the stock UNet with 9 channels and a mask_token, Framer's weights loaded
    framer_path = task.family.framer_path() / "unet"
    fresh = UNetSpatioTemporalConditionModel.from_pretrained(framer_path)
    add_mask_token(fresh, load_file(framer_path / "diffusion_pytorch_model.safetensors")["mask_token"])
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter")
    inputs = unet_inputs()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).sample, model(**inputs)[0])


def test_framer_tiny_config_trains_and_exports_framer_layout(tmp_path, capsys):
    from framer_ds.cli.main import main
    from framer_ds.train.loop import run_training

    samples = ["model.samples.every=4", "model.samples.count=1", "model.samples.num_inference_steps=2"]
    lora_only = [
        "model.base.train_modules=unet_lora",
        "data.tracks=null",
        "model.interp_eval.enabled=false",
    ]
    config = load_run_config(FRAMER_TINY, [f"output_dir={tmp_path / 'run'}", *samples, *lora_only])
    run_training(config)
    final = tmp_path / "run" / "final"
    assert len(list((tmp_path / "run" / "samples" / "step_4").glob("*.mp4"))) == 1  # Framer's sampler
    train_lines, eval_lines = read_metrics(tmp_path / "run")
    assert len(train_lines) == 4 and eval_lines and all(x["loss"] == x["loss"] for x in train_lines)
    adapter = load_file(final / "adapter_model.safetensors")
    assert adapter and all(t.numel() for t in adapter.values())
    assert not any("conv_in" in k or "mask_token" in k for k in adapter)  # Framer's UNet is 9-channel already
    metadata = json.loads((final / "framer_ds_video_lora.json").read_text())
    assert metadata["base"] == "framer" and metadata["conv_in_extra_channels"] == 0

    out = tmp_path / "framer_export"
    assert main(["export", str(final), "--format", "framer", "--out", str(out)]) == 0
    assert "Framer's layout" in capsys.readouterr().out
    unet = load_framer_unet(out / "unet")  # strict: exactly Framer's keys, 9 channels, mask_token
    controlnet = load_framer_controlnet(out / "controlnet")
    assert json.loads((out / "unet" / "config.json").read_text())["in_channels"] == 9
    assert json.loads((out / "controlnet" / "config.json").read_text())["_class_name"] == "ControlNetSVDModel"
    base = load_framer_unet(config_framer_path(config) / "unet")
    tuned = PeftModel.from_pretrained(base, final)
    inputs = unet_inputs()
    with torch.no_grad():
        torch.testing.assert_close(unet(**inputs).sample, tuned(**inputs).sample, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(unet.mask_token, base.mask_token)
    base_controlnet = load_framer_controlnet(config_framer_path(config) / "controlnet")
    for key, value in base_controlnet.state_dict().items():  # unet_lora: the base ControlNet, copied
        torch.testing.assert_close(controlnet.state_dict()[key], value)
    assert main(["export", str(final), "--format", "framer", "--out", str(out)]) == 1  # never overwrites
    # `--format merged` of a Framer run: Framer's UNet with the LoRA merged (not stock SVD's 8 channels)
    assert main(["export", str(final), "--format", "merged", "--out", str(tmp_path / "merged")]) == 0
    merged = load_framer_unet(tmp_path / "merged")
    assert "9 input channels + mask_token" in capsys.readouterr().out
    for key, value in unet.state_dict().items():
        torch.testing.assert_close(merged.state_dict()[key], value)

    from PIL import Image  # `framer-ds sample`: the Framer base + adapter, Framer's conditioning

    for name in ("first.png", "last.png"):
        Image.fromarray((torch.rand(64, 64, 3) * 255).byte().numpy()).save(tmp_path / name)
    video = tmp_path / "sample.mp4"
    frames = ["--image", str(tmp_path / "first.png"), "--last-image", str(tmp_path / "last.png")]
    assert main(["sample", str(final), *frames, "--out", str(video), "--steps", "2"]) == 0
    assert "4 frames at 64x64" in capsys.readouterr().out


def config_framer_path(config):
    return VideoLoraTask(config).family.framer_path()


def test_validate_names_what_a_framer_run_lacks(tmp_path):
    task = framer_task(tmp_path, "model.base.train_modules=controlnet", "data.tracks=null")
    problems = {p.where: p.message for p in task.check()}
    assert "data.tracks" in problems["model.base.train_modules"]
    task = framer_task(tmp_path, "model.base.train_modules=controlnet", "data.tracks.tracker=analytic")
    assert not task.check()
    with pytest.raises(
        ConfigError, match=r"model\.base\.mode: got 'image_to_video': Input should be 'interpolation'"
    ):
        load_run_config(FRAMER_TINY, ["model.base.mode=image_to_video"])


@pytest.mark.distributed
def test_zero3_two_process_controlnet_and_lora_export_is_complete(tmp_path):
    """train_modules both with point heatmaps from data.tracks, under ZeRO-3 with every tensor partitioned:
    final/ holds the whole ControlNet, gathered (loads strictly, trained away from the base), beside the
    LoRA adapter and the trained mask_token (gathered too: ZeRO-3 partitions it like any parameter)."""
    args = [
        f"output_dir={tmp_path / 'run'}",
        "model.base.train_modules=both",
        "model.train_mask_token=true",
        "data.tracks.tracker=analytic",
        "train.length.steps=2",
        "train.eval.every=null",
        "train.checkpoint.every=null",
        "data.val_fraction=0",
    ]
    cmd = accelerate_launch_cmd(
        *strategy_launch_args("zero3", tmp_path), "-m", "framer_ds", "train", str(FRAMER_TINY), *args
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-5000:]
    final = tmp_path / "run" / "final"
    adapter = load_file(final / "adapter_model.safetensors")
    assert adapter and not [name for name, t in adapter.items() if t.numel() == 0]
    trained = load_framer_controlnet(final / "controlnet")  # strict: every key, none empty
    base = load_framer_controlnet(config_framer_path(load_run_config(FRAMER_TINY, args)) / "controlnet")
    changed = [k for k, v in base.state_dict().items() if not torch.equal(trained.state_dict()[k], v)]
    assert changed
    token = load_file(final / "mask_token.safetensors")["mask_token"]
    base_unet = load_framer_unet(config_framer_path(load_run_config(FRAMER_TINY, args)) / "unet")
    assert token.shape == base_unet.mask_token.shape and not torch.equal(token, base_unet.mask_token)


def test_sampler_feeds_framers_conditioning_and_controlnet(tmp_path):
    """Our sampler with `FramerSampling` feeds the denoiser what Framer's pipeline feeds its UNet and
    ControlNet: [uncond, cond] halves, mask token on the missing frames, mask 1 there, CLIP seq 2."""
    from diffusers import AutoencoderKLTemporalDecoder, EulerDiscreteScheduler
    from transformers import CLIPVisionModelWithProjection

    from framer_ds.tasks.video_lora.framer.conditioning import FramerSampling
    from framer_ds.tasks.video_lora.svd.sampling import SamplerParts, sample_video

    task = framer_task(tmp_path)
    model = task.build_model().eval()
    vae = AutoencoderKLTemporalDecoder.from_pretrained(task.family.svd_path(), subfolder="vae")
    encoder = CLIPVisionModelWithProjection.from_pretrained(task.family.svd_path(), subfolder="image_encoder")
    scheduler = EulerDiscreteScheduler.from_pretrained(task.family.svd_path(), subfolder="scheduler")
    seen = []

    def denoiser(*args, **kwargs):
        seen.append((args, kwargs))
        return model(*args, **kwargs)

    parts = SamplerParts(denoiser, task.family.bare_unet, vae, encoder, scheduler)
    first, last = torch.rand(3, 64, 64) * 2 - 1, torch.rand(3, 64, 64) * 2 - 1
    token = task.family.bare_unet.mask_token.detach()

    def sample(controlnet_cond):
        seen.clear()
        framer = FramerSampling(token, controlnet_cond, conditioning_scale=1.0, step_range=(0.0, 0.5))
        generator = torch.Generator().manual_seed(0)
        return sample_video(
            parts, first, last, 4, 7.0, 127, num_inference_steps=2, generator=generator, conditioning=framer,
            on_step=lambda: steps.append(1),  # what moves the sampling progress bar
        )  # fmt: skip

    steps = []
    plain = sample(None)
    assert len(steps) == 2  # one call per denoising step
    (model_in, _), kwargs = seen[0]
    assert model_in.shape == (2, 4, 9, 8, 8) and kwargs["encoder_hidden_states"].shape == (2, 2, 32)
    assert kwargs["encoder_hidden_states"][0].eq(0).all() and kwargs["encoder_hidden_states"][1].ne(0).any()
    cond = model_in[:, :, 4:]
    torch.testing.assert_close(cond[:, 1:-1, :4], token.expand(2, 2, 4, 8, 8))
    assert cond[:, 1:-1, 4].eq(1).all() and cond[:, [0, -1], 4].eq(0).all()
    assert cond[0, [0, -1], :4].eq(0).all() and cond[1, [0, -1], :4].ne(0).any()  # uncond: zero ends
    assert "controlnet_cond" not in kwargs  # no points: no ControlNet
    with_points = sample(heatmaps())
    assert seen[0][1]["controlnet_cond"].shape == (2, 4, 3, 64, 64)
    assert seen[1][1]["controlnet_cond"] is None  # step 1 of 2 lies outside step_range [0, 0.5)
    assert plain.shape == with_points.shape == (4, 3, 64, 64)
    assert not torch.equal(plain, with_points)


def test_controlnet_only_run_end_to_end(tmp_path, capsys):
    """train_modules controlnet: the UNet stays as released, only the ControlNet trains; every export
    and the sampler take a run with a trained ControlNet and no LoRA."""
    from PIL import Image

    from framer_ds.cli.main import main
    from framer_ds.train.loop import run_training

    overrides = [
        f"output_dir={tmp_path / 'run'}",
        "model.base.train_modules=controlnet",
        "train.length.steps=2",
    ]
    overrides += ["model.interp_eval.enabled=false", "train.eval.every=null", "model.samples.every=0"]
    config = load_run_config(FRAMER_TINY, overrides)
    run_training(config)
    final = tmp_path / "run" / "final"
    assert not (final / "adapter_model.safetensors").exists()
    trained = load_framer_controlnet(final / "controlnet")
    base_dir = config_framer_path(config)
    released = load_framer_controlnet(base_dir / "controlnet").state_dict()
    assert any(not torch.equal(v, released[k]) for k, v in trained.state_dict().items())

    assert main(["export", str(final), "--format", "peft", "--out", str(tmp_path / "peft")]) == 0
    assert "the trained ControlNet (controlnet/)" in capsys.readouterr().out
    assert not (tmp_path / "peft" / "adapter_model.safetensors").exists()
    for key, value in load_framer_controlnet(tmp_path / "peft" / "controlnet").state_dict().items():
        torch.testing.assert_close(value, trained.state_dict()[key])
    assert main(["export", str(final), "--format", "merged", "--out", str(tmp_path / "merged")]) == 1
    assert "no LoRA to merge; use --format framer" in capsys.readouterr().err
    assert main(["export", str(final), "--format", "framer", "--out", str(tmp_path / "framer")]) == 0
    assert "UNet unchanged" in capsys.readouterr().out
    exported = load_framer_unet(tmp_path / "framer" / "unet").state_dict()
    for key, value in load_framer_unet(base_dir / "unet").state_dict().items():
        assert torch.equal(exported[key], value), key

    for name in ("first.png", "last.png"):
        Image.fromarray((torch.rand(64, 64, 3) * 255).byte().numpy()).save(tmp_path / name)
    frames = ["--image", str(tmp_path / "first.png"), "--last-image", str(tmp_path / "last.png")]
    video = tmp_path / "sample.mp4"
    assert main(["sample", str(final), *frames, "--out", str(video), "--steps", "2"]) == 0
    assert video.stat().st_size > 0
    # `framer-ds eval` loads the export back (the released UNet + the trained ControlNet, no adapter)
    # and reproduces the run's own final evaluation
    assert main(["eval", str(tmp_path / "run")]) == 0
    _, eval_lines = read_metrics(tmp_path / "run")
    again = json.loads((tmp_path / "run" / "eval.json").read_text())["metrics"]["eval/loss"]
    assert again == pytest.approx(eval_lines[-1]["eval/loss"], rel=1e-4)
