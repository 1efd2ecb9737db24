"""`model.interp_eval`: held-out clips sampled from their first and last frames and scored in the eval
loop, the same on 1 and 2 processes (each clip has its own seed; totals are summed over ranks)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
from pathlib import Path

import pytest

from conftest import (
    REPO,
    accelerate_launch_cmd,
    launch_env,
    read_metrics,
    strategy_launch_args,
    train_in_process,
)
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.video_lora.task import VideoLoraTask
from framer_ds.train.loop import run_training

TINY = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
FRAMER_TINY = REPO / "configs" / "tasks" / "video_lora" / "framer_tiny.yaml"
METRICS = ("psnr", "psnr_mid", "ssim", "psnr_ends", "flicker_ratio", "clip_distance")
pytestmark = pytest.mark.timeout(600)

INTERP_ARGS = [
    "train.length.steps=1",
    # the one step runs at warmup's lr 0: 1 and 2 processes evaluate the same model
    "train.lr_schedule.warmup.steps=5",
    "train.eval.every=null",
    "train.checkpoint.every=null",
    "model.samples.every=0",
    "model.interp_eval.enabled=true",
    "model.interp_eval.num_inference_steps=2",
    "data.num_frames=3",
    "data.hflip=false",
]


def final_eval(run_dir) -> dict:
    _, eval_lines = read_metrics(run_dir)
    return eval_lines[-1]


ODD_HELD_OUT = "data.val_fraction=0.375"
"""3 of the 8 clips held out: an odd count, so on 2 ranks one repeats a clip that gather_for_metrics drops."""


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The tiny SVD with INTERP_ARGS and 3 held-out clips trained in this process, and what it printed:
    the run every metric is checked on, and the 1-process side of the 1-vs-2-process comparison (one
    training serves both: that comparison needs the odd count, and every metric is defined on any)."""
    run = tmp_path_factory.mktemp("interp_one_process") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        train_in_process(TINY, [f"output_dir={run}", *INTERP_ARGS, ODD_HELD_OUT])
    return run, printed.getvalue()


def test_interp_eval_reports_every_metric_at_the_evaluation(one_process_run):
    run, printed = one_process_run
    line = final_eval(run)
    for name in METRICS:
        assert math.isfinite(line[f"eval/{name}"]), (name, line)
    assert 0 < line["eval/psnr"] < 100 and -1 <= line["eval/ssim"] <= 1
    assert "eval/loss" in line and not any("flicker_energy" in k for k in line)
    assert "eval/lpips skipped" in printed


def test_interp_eval_problems_are_named(tmp_path):
    config = load_run_config(
        TINY, [f"output_dir={tmp_path / 'run'}", *INTERP_ARGS, "data.num_frames=2", "data.cache.enabled=true"]
    )
    problems = [p.message for p in VideoLoraTask(config).check()]
    assert any("num_frames >= 3" in m for m in problems) and not any("data.cache" in m for m in problems)
    with pytest.raises(ConfigError):
        load_run_config(TINY, [f"output_dir={tmp_path}", "model.interp_eval.enabeld=true"])


def test_eval_command_reproduces_the_runs_final_evaluation(tmp_path, capsys, monkeypatch):
    """`framer-ds eval RUN`: the export loaded into a fresh model, evaluated on the run's held-out clips,
    gives the metrics the run logged at its end; RUN/eval.json holds them."""
    from framer_ds.cli.main import main

    run = tmp_path / "run"
    overrides = [
        *INTERP_ARGS,
        "train.length.steps=3",
        "train.lr_schedule.warmup=null",
        "train.optimizer.learning_rate=0.01",
    ]
    overrides += [
        "train.eval.best_metric=eval/psnr",
        "train.eval.best_mode=max",
    ]  # a metric of its own keeps best/
    config = load_run_config(TINY, [f"output_dir={run}", *overrides])
    run_training(config)
    logged = final_eval(run)
    assert main(["eval", str(run)]) == 0
    assert "eval.json" in capsys.readouterr().out
    report = json.loads((run / "eval.json").read_text())
    assert report["processes"] == 1 and report["eval_examples"] == 2
    for name, value in report["metrics"].items():
        assert value == pytest.approx(logged[name], rel=1e-4, abs=1e-6), name
    assert json.loads((run / "best" / "best.json").read_text())["metric"] == "eval/psnr"
    assert main(["eval", str(run), "--export", "best"]) == 0
    best = json.loads((run / "eval_best.json").read_text())["metrics"]
    assert best["eval/psnr"] == pytest.approx(
        report["metrics"]["eval/psnr"], rel=1e-4
    )  # one eval: same model
    assert main(["eval", str(tmp_path / "nowhere")]) == 1
    monkeypatch.setattr(VideoLoraTask, "load_export", lambda self, model, export_dir: model)
    assert main(["eval", str(run)]) == 0  # the base model: the export's weights did make the difference
    untrained = json.loads((run / "eval.json").read_text())["metrics"]
    assert untrained["eval/loss"] != pytest.approx(report["metrics"]["eval/loss"], rel=1e-3)


@pytest.mark.distributed
def test_interp_eval_is_the_same_on_one_and_two_processes(one_process_run, tmp_path):
    """ZeRO-3 on 2 CPU processes vs 1 (every sampling forward a collective, every tensor partitioned):
    the held-out clips split between ranks (an odd count, so one rank repeats a clip that
    gather_for_metrics drops) and every metric mean is the same; then `framer-ds eval` on 2 DDP
    processes gives the same numbers again. The 1-process run is the module's (trained in this process:
    the same `run_training` a 1-process launch runs, without a launcher's start-up)."""
    single, _ = one_process_run
    results = {"single": final_eval(single)}
    train = ("-m", "framer_ds", "train", str(TINY), f"output_dir={tmp_path / 'zero3'}", *INTERP_ARGS)
    cmd = accelerate_launch_cmd(*strategy_launch_args("zero3", tmp_path), *train, ODD_HELD_OUT)
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-5000:]
    results["zero3"] = final_eval(tmp_path / "zero3")
    for name in (*METRICS, "loss"):  # eval/loss too: its noise is drawn per clip, whatever the batching
        assert results["zero3"][f"eval/{name}"] == pytest.approx(results["single"][f"eval/{name}"], rel=1e-4)
    # `framer-ds eval` of the single-process run's export on 2 processes: the same numbers again
    cmd = accelerate_launch_cmd(
        *strategy_launch_args("ddp", tmp_path), "-m", "framer_ds", "eval", str(single)
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads((single / "eval.json").read_text())
    assert report["processes"] == 2 and report["eval_examples"] == 3
    for name in METRICS:
        assert report["metrics"][f"eval/{name}"] == pytest.approx(results["single"][f"eval/{name}"], rel=1e-4)


def test_interp_eval_from_the_latent_cache_matches_the_pixel_run(tmp_path, capsys, monkeypatch):
    """With data.cache on, the eval loader's cached entries carry their clips' real frames: the metrics
    are those of the same run without the cache (same clips, seeds and model: lr 0 at step 1); the VAE
    and encoder that evaluation put on the device leave it before the next training step. `framer-ds
    eval` of the cached run reproduces its final evaluation."""
    from framer_ds.tasks.video_lora.svd.frozen_encoders import FrozenSvdEncoders

    releases = []
    release = FrozenSvdEncoders.release
    monkeypatch.setattr(FrozenSvdEncoders, "release", lambda self: releases.append(1) or release(self))
    lines = {}
    cache = ["data.cache.enabled=true", f"data.cache.dir={tmp_path}/c"]
    lpips = [f"model.interp_eval.{k}={v}" for k, v in write_lpips_files(tmp_path).items()]  # eval/lpips too
    for name, extra in (("pixels", []), ("cached", cache)):
        overrides = [
            f"output_dir={tmp_path / name}",
            *INTERP_ARGS,
            "train.length.steps=2",
            "train.eval.every.steps=1",
        ]
        run_training(load_run_config(TINY, [*overrides, *lpips, *extra]))
        lines[name] = read_metrics(tmp_path / name)[1]
    out = capsys.readouterr().out
    assert "latent cache (eval)" in out and "eval/lpips from" in out
    assert len(releases) == 2  # after filling the cache, and after the step-1 evaluation
    assert len(lines["cached"]) == len(lines["pixels"]) == 2
    (cached, second), pixels = lines["cached"], lines["pixels"][0]  # step 2 trained on other draws
    assert cached["eval/lpips"] > 0
    for name in (*METRICS, "lpips"):
        assert cached[f"eval/{name}"] == pytest.approx(pixels[f"eval/{name}"], rel=1e-5), name
    from framer_ds.cli.main import main  # `framer-ds eval` of the cached run: its cache, its final numbers

    assert main(["eval", str(tmp_path / "cached")]) == 0
    report = json.loads((tmp_path / "cached" / "eval.json").read_text())["metrics"]
    for name in (*METRICS, "lpips", "loss"):
        assert report[f"eval/{name}"] == pytest.approx(second[f"eval/{name}"], rel=1e-4, abs=1e-6), name


def test_eval_pixels_refuses_a_cache_that_does_not_match_the_clips():
    from framer_ds.tasks.video_lora.shared.interp_eval import EvalPixels

    cached = [{"video_id": "a", "target": 0}, {"video_id": "b", "target": 1}]
    pixels = [{"video_id": "a", "pixel_values": 10}, {"video_id": "c", "pixel_values": 11}]
    merged = EvalPixels(cached, pixels)
    assert merged[0] == {"video_id": "a", "target": 0, "pixel_values": 10}
    with pytest.raises(RuntimeError, match="does not match the data"):
        merged[1]


def test_framer_base_interp_eval_and_eval_command(tmp_path, capsys, monkeypatch):
    """A Framer base (LoRA + ControlNet trained, point tracks): interp_eval samples through Framer's
    conditioning with each held-out clip's own heatmaps, and `framer-ds eval` loads final/'s adapter and
    controlnet/ into a fresh model and reproduces the run's final evaluation."""
    from framer_ds.cli.main import main
    from framer_ds.tasks.video_lora.framer.family import FramerFamily

    heatmaps = []
    sampling = FramerFamily.sampling

    def spy(self, controlnet_cond=None):
        heatmaps.append(None if controlnet_cond is None else tuple(controlnet_cond.shape))
        return sampling(self, controlnet_cond)

    monkeypatch.setattr(FramerFamily, "sampling", spy)
    run = tmp_path / "run"
    overrides = [
        f"output_dir={run}",
        "model.base.train_modules=both",
        "data.tracks.tracker=analytic",
        f"data.tracks.dir={tmp_path / 'tracks'}",
        "model.interp_eval.enabled=true",
        "model.interp_eval.num_inference_steps=2",
        "train.length.steps=2",
        "train.eval.every=null",
        "train.checkpoint.every=null",
        "train.optimizer.learning_rate=0.01",
        "train.lr_schedule.warmup=null",
    ]
    run_training(load_run_config(FRAMER_TINY, overrides))
    logged = final_eval(run)
    for name in METRICS:
        assert math.isfinite(logged[f"eval/{name}"]), name
    assert heatmaps and all(shape == (1, 4, 3, 64, 64) for shape in heatmaps)  # the clip's own tracks
    assert (run / "final" / "controlnet").is_dir() and (run / "final" / "adapter_model.safetensors").is_file()
    assert main(["eval", str(run)]) == 0
    report = json.loads((run / "eval.json").read_text())
    for name, value in report["metrics"].items():
        assert value == pytest.approx(logged[name], rel=1e-4, abs=1e-6), name
    monkeypatch.setattr(FramerFamily, "load_export", lambda self, model, export_dir: model)
    assert main(["eval", str(run)]) == 0  # the base Framer: the export's weights made the difference
    untrained = json.loads((run / "eval.json").read_text())["metrics"]
    assert untrained["eval/loss"] != pytest.approx(report["metrics"]["eval/loss"], rel=1e-3)


def test_validation_samples_condition_each_clip_on_its_own_motion_bucket(tmp_path, monkeypatch):
    """motion_bucket from_data: a held-out clip is sampled at its own bucket, as interp_eval samples it;
    inputs without a bucket take the run's fixed one."""
    from types import SimpleNamespace

    import torch

    from framer_ds.tasks.video_lora.shared import validation_samples
    from framer_ds.tasks.video_lora.shared.options import SampleOptions
    from framer_ds.tasks.video_lora.svd import sampling
    from framer_ds.tasks.video_lora.svd.clip_sampler import SvdClipSampler

    clip = torch.zeros(3, 3, 8, 8)
    source = [
        {"pixel_values": clip, "video_id": "a", "fps": 7.0, "motion_bucket_id": torch.tensor(40)},
        {"pixel_values": clip, "video_id": "b", "fps": 7.0},
    ]
    options = SampleOptions(count=2, num_inference_steps=1)
    inputs = validation_samples.collect_sample_inputs(source, options, True, False, None)
    assert [i.motion_bucket for i in inputs] == [40, None]
    used = []

    def fake_sample(parts, first, last, num_frames, fps, motion_bucket_id, **kwargs):
        used.append(motion_bucket_id)
        return clip

    monkeypatch.setattr(sampling, "sample_video", fake_sample)
    accelerator = SimpleNamespace(num_processes=1, process_index=0, device="cpu", is_main_process=True)
    sampler = SvdClipSampler(None, None, None, motion_bucket=127)
    written = validation_samples.write_sample_round(accelerator, sampler, inputs, options, 3, tmp_path)
    assert used == [40, 127]
    # each video's JSON says which bucket it moved at and why, with its seed (as `framer-ds sample`'s)
    records = [json.loads(path.with_suffix(".json").read_text()) for path in written]
    assert [(r["motion_bucket"], r["seed"]) for r in records] == [(40, 0), (127, 1)]
    assert [r["motion_bucket_source"] for r in records] == [
        "the clip's motion score (from_data)",
        "model.motion_bucket",
    ]


def test_framer_validation_samples_drive_the_controlnet_with_each_clips_heatmaps(tmp_path, monkeypatch):
    """With data.tracks, held-out items carry their point heatmaps, and a validation sample runs the
    ControlNet on them (as interp_eval does), so the samples show what the trajectory branch learned."""
    from dataclasses import replace
    from types import SimpleNamespace

    import torch

    from framer_ds.tasks.video_lora.framer.conditioning import FramerSampling
    from framer_ds.tasks.video_lora.shared import validation_samples
    from framer_ds.tasks.video_lora.shared.options import SampleOptions
    from framer_ds.tasks.video_lora.svd import sampling
    from framer_ds.tasks.video_lora.svd.clip_sampler import SvdClipSampler

    clip = torch.zeros(3, 3, 8, 8)
    heat = [torch.full((3, 3, 8, 8), float(v)) for v in (1, 2)]
    source = [
        {"pixel_values": clip, "video_id": n, "fps": 7.0, "controlnet_cond": h}
        for n, h in zip("ab", heat, strict=True)
    ]
    options = SampleOptions(count=2, num_inference_steps=1)
    inputs = validation_samples.collect_sample_inputs(source, options, True, False, None)
    seen = []

    def fake_sample(*args, conditioning=None, **kwargs):
        seen.append(conditioning.controlnet_cond)
        return clip

    monkeypatch.setattr(sampling, "sample_video", fake_sample)
    accelerator = SimpleNamespace(num_processes=1, process_index=0, device="cpu", is_main_process=False)
    framer = FramerSampling(torch.zeros(1, 1, 4, 1, 1))
    setup = SimpleNamespace(sampling=lambda heatmaps: replace(framer, controlnet_cond=heatmaps))
    sampler = SvdClipSampler(None, None, setup, motion_bucket=127)
    validation_samples.write_sample_round(accelerator, sampler, inputs, options, 3, tmp_path)
    assert [tuple(h.shape) for h in seen] == [(1, 3, 3, 8, 8)] * 2
    assert [float(h.mean()) for h in seen] == [1.0, 2.0] and framer.controlnet_cond is None


def write_lpips_files(folder, net="alex", seed=0):
    """Random LPIPS weights in the published layouts: torchvision's `features.N.*` (+ a classifier the
    loader ignores) and the lpips wheel's `lin{k}.model.1.weight` (non-negative, as the real ones)."""
    import torch

    from framer_ds.tasks.video_lora.shared.lpips import NETS, Lpips

    torch.manual_seed(seed)
    features = {f"features.{k}": v for k, v in Lpips(net).features.state_dict().items()}
    torch.save({**features, "classifier.1.weight": torch.zeros(2, 2)}, folder / f"{net}_backbone.pth")
    lins = {f"lin{k}.model.1.weight": torch.rand(1, c, 1, 1) for k, c in enumerate(NETS[net][2])}
    torch.save(lins, folder / f"{net}_lpips.pth")
    return {"lpips_weights": folder / f"{net}_lpips.pth", "lpips_backbone": folder / f"{net}_backbone.pth"}


def reference_alex_lpips(backbone: dict, lins: dict, x, y):
    """LPIPS v0.1 written out with torch.nn.functional from the two files, as the lpips package
    computes it (ScalingLayer, AlexNet's five ReLUs, unit-normalised channels, lin weights, mean)."""
    import torch
    import torch.nn.functional as F

    shift = torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1)
    scale = torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1)

    def conv(h, index, **kw):
        return F.relu(
            F.conv2d(h, backbone[f"features.{index}.weight"], backbone[f"features.{index}.bias"], **kw)
        )

    def relus(z):
        h1 = conv((z - shift) / scale, 0, stride=4, padding=2)
        h2 = conv(F.max_pool2d(h1, 3, 2), 3, padding=2)
        h3 = conv(F.max_pool2d(h2, 3, 2), 6, padding=1)
        h4 = conv(h3, 8, padding=1)
        return [h1, h2, h3, h4, conv(h4, 10, padding=1)]

    total = torch.zeros(x.shape[0])
    for k, (a, b) in enumerate(zip(relus(x), relus(y), strict=True)):
        a = a / (a.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
        b = b / (b.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
        total += ((a - b) ** 2 * lins[f"lin{k}.model.1.weight"].view(1, -1, 1, 1)).sum(1).mean((1, 2))
    return total


def test_lpips_from_local_files_in_the_published_layouts(tmp_path):
    import torch

    from framer_ds.tasks.video_lora.shared.lpips import load_lpips

    files = write_lpips_files(tmp_path)
    model = load_lpips(files["lpips_weights"], files["lpips_backbone"])
    assert model.net == "alex"
    torch.manual_seed(1)
    x, y = torch.rand(2, 3, 32, 32) * 2 - 1, torch.rand(2, 3, 32, 32) * 2 - 1
    assert torch.equal(model(x, x), torch.zeros(2))
    d = model(x, y)
    assert (d > 0).all() and torch.allclose(d, model(y, x))
    backbone, lins = torch.load(files["lpips_backbone"]), torch.load(files["lpips_weights"])
    torch.testing.assert_close(d, reference_alex_lpips(backbone, lins, x, y), rtol=1e-5, atol=1e-7)
    vgg = write_lpips_files(tmp_path, "vgg")
    assert load_lpips(vgg["lpips_weights"], vgg["lpips_backbone"]).net == "vgg"  # known by its channels
    with pytest.raises(ValueError, match="vgg16 state dict"):
        load_lpips(vgg["lpips_weights"], files["lpips_backbone"])  # calibration and backbone differ


def test_lpips_options_go_together_and_name_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="go together"):
        load_run_config(TINY, [f"output_dir={tmp_path}", f"model.interp_eval.lpips_weights={tmp_path}/w"])
    files = [f"model.interp_eval.lpips_{k}={tmp_path}/{k}.pth" for k in ("weights", "backbone")]
    config = load_run_config(TINY, [f"output_dir={tmp_path / 'run'}", *INTERP_ARGS, *files])
    problems = {p.where: p.message for p in VideoLoraTask(config).check()}
    assert "is not a file" in problems["model.interp_eval.lpips_weights"]
    assert "model.interp_eval.lpips_backbone" in problems


@pytest.mark.distributed
def test_framer_interp_eval_from_the_cache_under_zero3_matches_one_process(tmp_path):
    """A Framer base with point tracks: ZeRO-3 on 2 CPU processes reading the latent cache (its eval
    entries given their real frames, each sampling forward a collective, 3 clips: one rank repeats one)
    gives the metrics of one process reading the pixels."""
    results = {}
    common = [
        "model.base.train_modules=both",
        "data.tracks.tracker=analytic",
        f"data.tracks.dir={tmp_path / 'tracks'}",
        *[a for a in INTERP_ARGS if not a.startswith(("data.num_frames", "data.hflip"))],
        ODD_HELD_OUT,
    ]
    # one process: trained in this process (the `run_training` a 1-process launch runs)
    train_in_process(FRAMER_TINY, [f"output_dir={tmp_path / 'single'}", *common])
    results["single"] = final_eval(tmp_path / "single")
    cache = ["data.cache.enabled=true", f"data.cache.dir={tmp_path}/c"]
    cmd = accelerate_launch_cmd(
        *strategy_launch_args("zero3", tmp_path),
        *("-m", "framer_ds", "train", str(FRAMER_TINY), f"output_dir={tmp_path / 'zero3'}", *common, *cache),
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-5000:]
    results["zero3"] = final_eval(tmp_path / "zero3")
    for name in METRICS:
        assert results["zero3"][f"eval/{name}"] == pytest.approx(results["single"][f"eval/{name}"], rel=1e-4)
