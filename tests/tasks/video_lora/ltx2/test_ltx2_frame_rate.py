"""LTX-2 trains each clip at its own frame rate (ltx2/frame_rate.py): its positions are in seconds (frame
index / frame rate), so a 12 fps clip taught at 24 fps learns the wrong time scale. The video and keyframe
coordinates of the transformer call follow each clip's rate (source fps / stride, or `model.fps`), a
clip at 24 fps gets exactly the pipelines' numbers, the latent cache stores the rate so a cached batch
trains as the uncached one, and the samplers default to the rate training saw."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import default_collate

from conftest import REPO

CONFIG = REPO / "configs" / "tasks" / "video_lora" / "ltx2_tiny.yaml"


def _task(tmp_path: Path, *overrides: str):
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.run_config import load_run_config

    config = load_run_config(CONFIG, [f"output_dir={tmp_path / 'run'}", *overrides])
    return get_task_class("video_lora")(config)


@contextmanager
def transformer_calls(model: torch.nn.Module) -> Iterator[list[dict]]:
    """The keyword arguments of every call of the LTX-2 transformer under `model` in the block."""
    from framer_ds.tasks.video_lora.ltx2.lora import unwrapped

    seen: list[dict] = []
    hook = unwrapped(model).register_forward_pre_hook(lambda m, a, kw: seen.append(kw), with_kwargs=True)
    try:
        yield seen
    finally:
        hook.remove()


def _same_clip_at(family, rates: list[float]) -> dict[str, torch.Tensor]:
    """A cached-style batch: one clip's latents and prompt states repeated, each copy at its own rate."""
    one = {k: v[:1] for k, v in family.example_batch(family.config, 1).items()}
    generator = torch.Generator().manual_seed(0)
    one = {k: torch.randn(v.shape, generator=generator) if k != "prompt_mask" else v for k, v in one.items()}
    batch = {k: v.expand(len(rates), *v.shape[1:]).clone() for k, v in one.items()}
    return {**batch, "fps": torch.tensor(rates, dtype=torch.float64)}


def _losses(family, model, batch: dict) -> torch.Tensor:
    """Per-clip eval losses (each clip's noise from its own generator, seeded alike)."""
    generators = [torch.Generator().manual_seed(7) for _ in batch["fps"]]
    with torch.no_grad():
        return family.eval_losses(model, batch, generators)["loss"]


def _videos(*rates: float) -> list[SimpleNamespace]:
    """Indexed videos as `note_records` reads them (the config's stride is 1)."""
    return [SimpleNamespace(video_id=f"v{i}.mp4", source_fps=r) for i, r in enumerate(rates)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """The tiny LTX-2 family (interpolation: keyframe tokens too) of a run on 24 and 12 fps videos, and
    its LoRA'd transformer."""
    task = _task(tmp_path_factory.mktemp("ltx2_rate"))
    task.family.prepare()
    task.family.note_records(_videos(24.0, 12.0))
    return task.family, task.family.build_model(gradient_checkpointing=False).eval()


def test_each_clip_is_positioned_at_its_own_frame_rate(tiny) -> None:
    """The same clip at 24 and 12 fps in one micro-batch: its video and keyframe positions are in seconds
    (the 12 fps copy's times twice the 24 fps copy's), the 24 fps copy gets exactly the pipelines'
    numbers (`prepare_video_coords(fps=24)`, the condition pipeline's keyframe coordinates), the audio is
    as long as each clip lasts (the run's videos differ in rate: one transformer call per clip), and each
    clip's loss is the one it has alone (calls of batch 1: the same float operations, so exactly equal)."""
    from framer_ds.tasks.video_lora.ltx2.conditioning import keyframe_coords

    family, model = tiny
    with transformer_calls(model) as calls:
        mixed = _losses(family, model, _same_clip_at(family, [24.0, 12.0]))
    assert family.per_clip_calls
    first = calls[:2]  # the first eval sigma: one call per clip
    assert [c["hidden_states"].shape[0] for c in first] == [1, 1]
    at_24, at_12 = (c["video_coords"] for c in first)
    frames, height, width = family.example_batch(family.config, 1)["target"].shape[2:]
    today = model.get_base_model().rope.prepare_video_coords(1, frames, height, width, "cpu", fps=24.0)
    video_tokens = frames * height * width
    assert torch.equal(at_24[:, :, :video_tokens], today)  # max abs 0.0: a 24 fps clip as before
    keyframe = keyframe_coords(family.folder_config("vae"), frames - 1, (height, width), 24.0, "cpu")
    assert torch.equal(at_24[:, :, video_tokens:], keyframe)
    assert torch.equal(at_12[:, 0], 2 * at_24[:, 0])  # the time axis: seconds at 12 fps = 2x those at 24
    assert torch.equal(at_12[:, 1:], at_24[:, 1:])  # space does not depend on the rate
    assert first[1]["audio_num_frames"] > first[0]["audio_num_frames"]  # 9 frames last 0.75 s, not 0.375
    alone = [_losses(family, model, _same_clip_at(family, [rate])) for rate in (24.0, 12.0)]
    assert torch.equal(mixed, torch.cat(alone)) and mixed[0] != mixed[1]


def test_a_run_at_one_rate_makes_one_call_per_micro_batch(tmp_path: Path, tiny) -> None:
    """The number of transformer calls is decided by the run's data, never by a batch's clips (under
    ZeRO-3 / FSDP2 every call gathers weights collectively: ranks must make as many): one call per
    micro-batch when every clip trains at one rate (one video rate and stride, or `model.fps`), one per
    clip otherwise, even for a batch whose clips happen to share a rate."""
    family, model = tiny
    one_rate = _task(tmp_path).family
    one_rate.prepare()
    one_rate.note_records(_videos(12.0, 12.0))
    fixed = _task(tmp_path, "model.fps=24").family
    fixed.prepare()
    fixed.note_records(_videos(24.0, 12.0))
    assert not one_rate.per_clip_calls and not fixed.per_clip_calls
    for run, made in ((one_rate, 1), (fixed, 1), (family, 2)):
        with transformer_calls(model) as calls:
            _losses(run, model, _same_clip_at(family, [12.0, 12.0]))
        assert len(calls) == made * family.config.model.base.eval_sigmas
        assert [c["hidden_states"].shape[0] for c in calls[:made]] == [2 // made] * made


def test_model_fps_sets_one_rate_for_every_clip(tmp_path: Path, tiny) -> None:
    """`model.fps` (SVD's key, the same meaning: the rate training conditions on) is an LTX-2 key now:
    the clips train at it whatever their own rate, exactly as clips at 24 fps of a run on 24 fps videos;
    Wan still refuses it (tests/tasks/video_lora/wan/test_wan_family.py)."""
    family, model = tiny
    fixed, own = _task(tmp_path, "model.fps=24").family, _task(tmp_path).family
    for run in (fixed, own):
        run.prepare()
        run.note_records(_videos(24.0) if run is own else _videos(12.0, 30.0))
    assert fixed.config.model.fps == 24.0
    batch = _same_clip_at(family, [12.0, 30.0])
    assert fixed.clip_rates(family.encode(batch)) == [24.0, 24.0]
    at_24 = _same_clip_at(family, [24.0, 24.0])
    assert torch.equal(_losses(fixed, model, batch), _losses(own, model, at_24))
    at_12 = _same_clip_at(family, [12.0, 12.0])  # without model.fps the rate matters
    assert not torch.equal(_losses(own, model, at_12), _losses(own, model, at_24))


def test_the_latent_cache_stores_each_clips_rate_and_trains_as_uncached(tmp_path: Path) -> None:
    """Clips drawn at stride 1 or 2 of 12 fps videos (12 or 6 fps): each cache entry holds its clip's
    rate, and an entry's eval loss equals the uncached clip's (encoded alone, as the cache encodes it:
    the same float operations, so exactly equal)."""
    from accelerate import Accelerator

    from framer_ds.data.item_draws import drawn_at_epoch

    strides = ["data.stride=null", "data.stride_range=[1,2]"]
    task = _task(tmp_path, f"data.cache.dir={tmp_path / 'latents'}", *strides)
    task.prepare_data()
    train, val = task.build_datasets()
    task.setup_frozen(Accelerator(cpu=True))
    cached_train, _ = task.precompute(task.accelerator, train, val)
    rates = set()
    for entry in range(len(cached_train)):
        with drawn_at_epoch(train, entry // len(train)):  # copy k of a clip: the draw of epoch k
            item = train[entry % len(train)]
        assert float(cached_train[entry]["fps"]) == item["fps"]
        rates.add(item["fps"])
    assert rates == {12.0, 6.0}, rates
    assert task.family.rates == {12.0, 6.0} and task.family.per_clip_calls  # noted from the data
    family, model = task.family, task.family.build_model(gradient_checkpointing=False).eval()
    task.frozen.on_device(task.accelerator)  # released after the cache filled: the uncached path encodes
    for entry in range(2):
        with drawn_at_epoch(train, 0):
            item = train[entry]
        cached = {k: v for k, v in default_collate([cached_train[entry]]).items() if k != "video_id"}
        uncached = default_collate([item])
        assert torch.equal(_losses(family, model, cached), _losses(family, model, uncached))


def test_training_samples_and_interp_eval_sample_at_the_clips_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Ltx2ClipSampler` runs the pipeline at the rate the clip trained at (`ClipToSample.fps`: `model.fps`
    or the clip's own), as SVD's sampler does, and its record says so."""
    from framer_ds.tasks.video_lora.ltx2 import sampling
    from framer_ds.tasks.video_lora.shared.protocol import ClipToSample

    seen = {}

    def pipeline(pipe, mode, frames, prompt, shape, steps, generator, **kwargs):
        seen.update(kwargs)
        return torch.zeros(1, shape[0], 3, shape[1], shape[2])

    monkeypatch.setattr(sampling, "run_pipeline", pipeline)
    sampler = sampling.Ltx2ClipSampler.__new__(sampling.Ltx2ClipSampler)
    sampler.family, sampler.mode, sampler.pipe = SimpleNamespace(prompts={"v": "p"}), "interpolation", None
    frame = torch.zeros(3, 16, 16)
    clip = ClipToSample(video_id="v", first=frame, last=frame, num_frames=9, fps=12.0, motion_bucket=None)
    settings = SimpleNamespace(num_inference_steps=2)
    sampler.sample(clip, settings, torch.Generator())
    assert seen["frame_rate"] == 12.0
    assert sampler.record(clip, settings)["fps"] == 12.0


def test_an_export_records_the_rate_it_trained_at_and_sample_defaults_to_it() -> None:
    """The record's `fps` (SVD's names: the median of the training clips' rates, or model.fps) is
    `framer-ds sample`'s default; an export written before it was recorded trained at 24 fps."""
    from framer_ds.tasks.video_lora.ltx2.export import export_frame_rate
    from framer_ds.tasks.video_lora.shared.exports import trained_fps_metadata

    record = trained_fps_metadata(None, [12.0, 6.0, 12.0])
    assert record["fps"] == 12.0 and record["fps_range"] == [6.0, 12.0]
    assert export_frame_rate(record) == 12.0
    assert export_frame_rate(trained_fps_metadata(30.0, [12.0])) == 30.0
    assert export_frame_rate({"frame_rate": 24.0}) == 24.0
