"""The video_lora task on tiny random SVD components (saved with save_pretrained and loaded back the
way real weights are) and small mp4 clips written with PyAV."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest
import torch
from diffusers import UNetSpatioTemporalConditionModel
from peft import PeftModel
from safetensors.torch import load_file

from conftest import REPO, accelerate_launch_cmd, launch_env, read_metrics, strategy_launch_args
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.video_lora.shared.data.synthetic_video import ensure_synthetic_clips
from framer_ds.tasks.video_lora.shared.exports import EXPORT_METADATA
from framer_ds.tasks.video_lora.svd.options import SvdBase
from framer_ds.tasks.video_lora.svd.unet import widen_conv_in
from framer_ds.tasks.video_lora.task import VideoLoraTask
from framer_ds.train.loop import run_training

TINY = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
pytestmark = pytest.mark.timeout(600)


def tiny_config(tmp_path, *overrides):
    return load_run_config(TINY, [f"output_dir={tmp_path / 'run'}", *overrides])


@pytest.mark.slow
def test_tiny_interpolation_run_learns_and_exports_a_loadable_adapter(tmp_path, capsys):
    config = tiny_config(
        tmp_path, "train.length.steps=20", "train.eval.every.steps=10", "train.checkpoint.every.steps=10"
    )
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
    # model.fps is null: the adapter records what training conditioned on (12 fps clips at stride 2)
    assert metadata["fps"] == 6.0 and metadata["fps_range"] == [6.0, 6.0]

    # a plain diffusers + peft script: base UNet, widen conv_in, load the adapter
    task = VideoLoraTask(config)
    unet = UNetSpatioTemporalConditionModel.from_pretrained(task.family.svd_path(), subfolder="unet")
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
    printed = capsys.readouterr().out
    assert "conditioned on 6 fps" in printed  # the trained fps, not SVD's default 7
    assert "(H.264)" in printed and "sample_frames" in printed
    import av

    with av.open(str(out)) as container:
        assert container.streams.video[0].codec_context.name == "h264"
        decoded = list(container.decode(video=0))
    assert len(decoded) == 4 and (decoded[0].width, decoded[0].height) == (64, 64)
    assert len(list((tmp_path / "sample_frames").glob("frame_*.png"))) == 4
    tuned_options = ["--num-frames", "3", "--motion-bucket-id", "60", "--fps", "9", "--noise-aug", "0.05"]
    more = [*args, "--last-image", str(tmp_path / "last.png"), *tuned_options, "--min-guidance", "1.5"]
    assert main([*more, "--max-guidance", "2.5", "--decode-chunk-size", "2", "--resize", "pad"]) == 0
    with av.open(str(out)) as container:
        assert len(list(container.decode(video=0))) == 3

    # `framer-ds export --format merged`: the merged UNet loads with diffusers alone and computes as
    # base+adapter
    merged = tmp_path / "merged_unet"
    with pytest.raises(SystemExit):  # without --format: argparse names the required flag, not a no-op
        main(["export", str(final), "--out", str(merged)])
    assert main(["export", str(final), "--format", "merged", "--out", str(merged)]) == 0
    assert "UNetSpatioTemporalConditionModel.from_pretrained" in capsys.readouterr().out
    plain = UNetSpatioTemporalConditionModel.from_pretrained(merged)
    x, kwargs = torch.randn(1, 4, 9, 8, 8), {"added_time_ids": torch.tensor([[6.0, 127.0, 0.02]])}
    kwargs["encoder_hidden_states"] = torch.randn(1, 1, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            plain(x, torch.tensor([0.3]), **kwargs).sample,
            tuned(x, torch.tensor([0.3]), **kwargs).sample,
            rtol=1e-4,
            atol=1e-5,
        )
    assert main(["export", str(final), "--format", "merged", "--out", str(merged)]) == 1  # never overwrites


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

    unet = UNetSpatioTemporalConditionModel.from_pretrained(task.family.svd_path(), subfolder="unet")
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
    base = UNetSpatioTemporalConditionModel.from_pretrained(task.family.svd_path(), subfolder="unet")
    wide = widen_conv_in(
        UNetSpatioTemporalConditionModel.from_pretrained(task.family.svd_path(), subfolder="unet")
    )
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
    from framer_ds.tasks.video_lora.shared.data.synthetic_video import write_moving_shape_clip

    write_moving_shape_clip(root / "short.mp4", frames=3, width=96, height=80, fps=12, seed=9)
    write_moving_shape_clip(root / "five.mp4", frames=5, width=96, height=80, fps=12, seed=8)
    task = VideoLoraTask(
        tiny_config(
            tmp_path,
            "data.source.builtin=null",
            f"data.source.path={root}",
            "data.val_fraction=0",
            "data.max_rejected_fraction=0.3",  # 2 of 7 rejected: allowed, and named in the summary
        )
    )
    index = task._data().index()
    assert len(index.records) == 5  # five.mp4 is too short for stride 2 (7 frames) but fits stride 1
    reasons = {path.name: reason for path, reason in index.rejected}
    assert set(reasons) == {"broken.mp4", "short.mp4"}
    assert "too short" in reasons["short.mp4"]
    # the stride is capped for five.mp4, counted in the run summary and the data report
    train, _ = task.build_datasets()
    assert task.data_summary()["stride"].startswith("1 of 5 videos are too short for stride 2")
    assert task.data_summary()["videos"].startswith("usable: 5, rejected: 2\n")
    assert f"rejected {root / 'broken.mp4'}: PyAV cannot read it" in task.data_summary()["videos"]
    assert "stride: 1 of 5 videos" in task.data_report()
    five = next(i for i, r in enumerate(train.records) if r.video_id.startswith("five"))
    assert train[five]["fps"] == 12.0 and train[five]["pixel_values"].shape[0] == 4  # stride 1 -> 12 fps
    assert sorted(set(task.trained_fps)) == [6.0, 12.0]  # 12 fps at stride 2, and five.mp4 at stride 1


@pytest.mark.distributed
def test_zero3_offload_two_process_run_samples_and_saves_a_complete_adapter(tmp_path):
    """ZeRO-3 with every parameter partitioned and released after use, and the optimizer offloaded
    to the CPU by the DeepSpeed JSON: 3 samples over 2 ranks (one rank runs a dummy so both make the
    same collective forwards) do not hang, and the adapter is still complete."""
    config_args = [
        f"output_dir={tmp_path / 'run'}",
        "train.length.steps=2",
        "train.eval.every=null",
        "train.checkpoint.every.steps=2",
        "data.val_fraction=0",
        "model.samples.every=2",
        "model.samples.count=3",
        "model.samples.num_inference_steps=2",
    ]
    cmd = accelerate_launch_cmd(
        *strategy_launch_args("zero3_offload", tmp_path), "-m", "framer_ds", "train", str(TINY), *config_args
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-5000:]
    for adapter_dir in (tmp_path / "run" / "final", tmp_path / "run" / "checkpoints" / "step_2" / "adapter"):
        adapter = load_file(adapter_dir / "adapter_model.safetensors")
        empty = [name for name, t in adapter.items() if t.numel() == 0]
        assert adapter and not empty, (adapter_dir, empty)
    samples = sorted(p.name for p in (tmp_path / "run" / "samples" / "step_2").glob("*.mp4"))
    assert [name[:3] for name in samples] == ["00_", "01_", "02_"], samples


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
        "data.source.builtin=null",
        f"data.source.path={root}",
    ]
    assert main([*args, "data.max_rejected_fraction=0.25"]) == 0  # 1 of 4: at the limit, allowed
    out = capsys.readouterr().out
    assert "usable: 3, rejected: 1" in out and "broken.mp4" in out and "96x80" in out
    assert main(args) == 1  # the default 0.1: refused as training would refuse it
    err = capsys.readouterr().err
    assert "1 of 4 video files (25%) are unusable, more than data.max_rejected_fraction (0.1)" in err

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "only_broken.mp4").write_bytes(b"garbage" * 100)
    assert main([*args[:-1], f"data.source.path={empty}"]) == 1
    err = capsys.readouterr().err
    assert "only_broken.mp4" in err and "data.source.path: none of the" in err


@pytest.mark.slow
def test_validation_samples_are_written_and_logged_to_wandb_offline(tmp_path):
    config = tiny_config(
        tmp_path,
        "train.length.steps=4",
        "train.eval.every=null",
        "train.checkpoint.every=null",
        "model.samples.every=2",
        "model.samples.count=2",
        "model.samples.num_inference_steps=2",
        "log.wandb.offline=true",
        "log.wandb.project=framer_ds_test",
    )
    run_training(config)
    run = tmp_path / "run"
    import av

    for step in (2, 4):
        videos = sorted((run / "samples" / f"step_{step}").glob("*.mp4"))
        assert [v.name for v in videos] == ["00_clip_000.mp4", "01_clip_004.mp4"]  # held-out clips
        with av.open(str(videos[0])) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == 4 and frames[0].shape == (64, 128, 3)  # reference | sample
        pngs = sorted((videos[0].parent / "00_clip_000_frames").glob("*.png"))  # to compare frame by frame
        assert [p.name for p in pngs] == [f"frame_{i:03d}.png" for i in range(4)]
    media = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    media = [line for line in media if "media/samples" in line]
    assert [line["step"] for line in media] == [2, 4]
    assert media[0]["media/samples"][0] == "samples/step_2/00_clip_000.mp4"
    logged = list((run / "wandb").glob("offline-run-*/files/media/videos/samples_*.mp4"))
    assert len(logged) == 4, sorted(p.name for p in (run / "wandb").rglob("*"))


@pytest.mark.slow
def test_latent_cache_trains_without_the_vae_once_built(tmp_path, monkeypatch):
    cache_dir = tmp_path / "latents"
    overrides = [
        "train.length.steps=3",
        "train.eval.every.steps=3",
        "train.checkpoint.every=null",
        "data.cache.enabled=true",
        f"data.cache.dir={cache_dir}",
        "data.cache.clips_per_video=2",
        "model.samples.every=0",  # sampling would (rightly) load the VAE
    ]
    first = run_training(tiny_config(tmp_path / "a", *overrides))
    caches = sorted(p.parent for p in cache_dir.glob("*/complete.json"))
    sizes = sorted(len(list(c.glob("entry_*.safetensors"))) for c in caches)
    assert sizes == [2, 12]  # eval: 2 held-out videos; train: 6 videos x 2 clips

    from diffusers import AutoencoderKLTemporalDecoder

    def refuse(*args, **kwargs):
        raise AssertionError("the VAE was loaded although every clip is cached")

    monkeypatch.setattr(AutoencoderKLTemporalDecoder, "from_pretrained", refuse)
    second = run_training(tiny_config(tmp_path / "b", *overrides))
    assert second.eval_metrics == first.eval_metrics  # same cached tensors, same seed: same run
    import json

    summary = json.loads((tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()[0])[
        "run_summary"
    ]
    assert summary["frozen helpers"].startswith("VAE + image encoder: off the GPU"), summary

    # an edited source video changes the key: the cache is rebuilt, not silently reused
    config = tiny_config(tmp_path / "c", *overrides)
    video = sorted(VideoLoraTask(config).data_root().glob("*.mp4"))[0]
    video.touch()
    with pytest.raises(AssertionError, match="the VAE was loaded"):
        run_training(config)


def _write_pairs(root, count: int) -> None:
    from PIL import Image

    root.mkdir(parents=True)
    for i in range(count):
        for role, corner in (("start", 4 + i), ("end", 30 + i)):
            pixels = torch.full((64, 64, 3), 30, dtype=torch.uint8)
            pixels[corner : corner + 24, corner : corner + 24] = torch.tensor([200, 90 + 10 * i, 40])
            Image.fromarray(pixels.numpy()).save(root / f"pair{i}_{role}.png")


@pytest.mark.slow
def test_image_pair_layout_trains_interpolation(tmp_path):
    _write_pairs(tmp_path / "pairs", 6)
    config = tiny_config(
        tmp_path,
        "data.source.builtin=null",
        f"data.source.path={tmp_path / 'pairs'}",
        "data.layout=image_pairs",
        "data.num_frames=5",
        "model.fps=7",
        "train.length.steps=6",
        "train.eval.every.steps=3",
        "train.checkpoint.every=null",
        "model.samples.every=6",
        "model.samples.num_inference_steps=2",
    )
    run_training(config)
    train_lines, eval_lines = read_metrics(tmp_path / "run")
    assert len(train_lines) == 6 and all(math.isfinite(x["loss"]) for x in train_lines)
    assert len(eval_lines) == 2 and eval_lines[1]["eval/loss"] < eval_lines[0]["eval/loss"]
    import av

    with av.open(str(tmp_path / "run" / "samples" / "step_6" / "00_pair0.mp4")) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 5 and (frames[0].height, frames[0].width) == (64, 64)  # no reference clip


def test_image_pair_layout_problems_are_reported_together(tmp_path):
    _write_pairs(tmp_path / "pairs", 2)
    config = tiny_config(
        tmp_path,
        "data.source.builtin=null",
        f"data.source.path={tmp_path / 'pairs'}",
        "data.layout=image_pairs",
    )
    image_to_video = config.model.model_copy(update={"base": SvdBase(mode="image_to_video")})
    problems = {
        p.where: p.message for p in VideoLoraTask(config.model_copy(update={"model": image_to_video})).check()
    }
    assert "model.base.mode: interpolation" in problems["data.layout"] and "model.fps" in problems


def test_latent_cache_key_follows_what_decides_the_tensors(tmp_path):
    from types import SimpleNamespace

    def key(*overrides):
        task = VideoLoraTask(tiny_config(tmp_path, *overrides))
        task.prepare_data()
        train, _ = task.build_datasets()
        return task._cache_for(SimpleNamespace(mixed_precision="no"), train, "train", 1).key

    base = key()
    assert key() == base and key("train.length.steps=7") == base  # training length does not matter
    for changed in (
        "model.vae_tile_size=64",
        "data.hflip=false",
        "train.seed=1",
        "model.edm.cond_noise_std=0.4",
    ):
        assert key(changed) != base, changed


@pytest.mark.slow
def test_image_to_video_adapter_merges_into_a_pipeline_that_runs(tmp_path, capsys):
    """`framer-ds export --format merged` of an image-to-video adapter: a diffusers directory that
    `StableVideoDiffusionPipeline.from_pretrained` loads and runs, with the LoRA in its UNet."""
    from diffusers import StableVideoDiffusionPipeline
    from PIL import Image

    from framer_ds.cli.main import main

    config = tiny_config(
        tmp_path,
        "model.base.mode=image_to_video",
        "model.samples.every=0",
        "train.length.steps=3",
        "train.eval.every=null",
        "train.checkpoint.every=null",
        "model.lora.include_feed_forward=true",
    )
    run_training(config)
    final, out = tmp_path / "run" / "final", tmp_path / "merged"
    adapter = load_file(final / "adapter_model.safetensors")
    assert any(".ff_in.net.2." in name for name in adapter)  # temporal feed-forward layers adapted too
    assert main(["export", str(final), "--format", "merged", "--out", str(out)]) == 0
    assert "StableVideoDiffusionPipeline.from_pretrained" in capsys.readouterr().out
    pipe = StableVideoDiffusionPipeline.from_pretrained(out)
    task = VideoLoraTask(config)
    base = UNetSpatioTemporalConditionModel.from_pretrained(task.family.svd_path(), subfolder="unet")
    tuned = PeftModel.from_pretrained(base, final).merge_and_unload()
    for name, weight in tuned.state_dict().items():
        torch.testing.assert_close(pipe.unet.state_dict()[name], weight)
    frames = pipe(
        Image.new("RGB", (64, 64), (120, 40, 200)),
        height=64,
        width=64,
        num_frames=4,
        num_inference_steps=2,
        decode_chunk_size=2,
        output_type="np",
    ).frames[0]
    assert frames.shape == (4, 64, 64, 3)


def test_sampling_encodes_with_the_vae_dtype_training_uses(tmp_path):
    """SVD's VAE overflows in fp16: with force_upcast the pipeline encodes in fp32, and so do training
    and `framer-ds sample` (one rule: svd/conditioning.vae_dtype)."""
    from framer_ds.tasks.video_lora.svd.conditioning import vae_dtype
    from framer_ds.tasks.video_lora.svd.export import load_pipeline_with_adapter

    config = tiny_config(tmp_path)
    task = VideoLoraTask(config)
    task.prepare_data()
    model = task.build_model()
    model.save_pretrained(tmp_path / "adapter")
    (tmp_path / "adapter" / EXPORT_METADATA).write_text(
        json.dumps(
            {"base_model": str(task.family.svd_path()), "mode": "interpolation", "conv_in_extra_channels": 1}
        )
    )
    pipe, _ = load_pipeline_with_adapter(tmp_path / "adapter", "cpu", torch.float16)
    assert pipe.vae.config.force_upcast and pipe.vae.dtype == torch.float32
    assert pipe.unet.dtype == torch.float16
    assert vae_dtype(pipe.vae.config, torch.bfloat16) == torch.bfloat16


def test_sample_frames_are_framed_as_training_frames(tmp_path):
    """--resize crop (default) is the training loader's resize-and-centre-crop; stretch ignores the
    aspect ratio; pad letterboxes with black."""
    from PIL import Image

    from framer_ds.tasks.video_lora.shared.data.video_clips import resize_and_crop
    from framer_ds.tasks.video_lora.shared.exports import load_frame

    pixels = torch.randint(0, 256, (64, 128, 3), dtype=torch.uint8)
    Image.fromarray(pixels.numpy()).save(tmp_path / "wide.png")
    crop = load_frame(tmp_path / "wide.png", 64, 64, "cpu")
    torch.testing.assert_close(crop, resize_and_crop(pixels[None], 64, 64, random_crop=False)[0] * 2 - 1)
    stretch = load_frame(tmp_path / "wide.png", 64, 64, "cpu", "stretch")
    assert not torch.allclose(stretch, crop)
    pad = load_frame(tmp_path / "wide.png", 64, 64, "cpu", "pad")
    assert (pad[:, :16] == -1).all() and (pad[:, -16:] == -1).all() and not (pad[:, 16:48] == -1).all()
