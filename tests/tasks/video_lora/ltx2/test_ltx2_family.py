"""The LTX-2 family of the video_lora task (issue 50): configs/tasks/video_lora/ltx2_tiny.yaml trains a
LoRA on the video branch of the tiny LTX-2 base whose loss falls; its final/ adapter, loaded into
diffusers' own pipeline with `load_lora_weights` (`LTX2ConditionPipeline` for interpolation,
`LTX2ImageToVideoPipeline` for image_to_video), gives `framer-ds sample`'s frames; a complete latent
cache never loads an encoder; LTX-2's size and frame-count rules are its own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REPO, read_metrics, train_in_process

CONFIG = REPO / "configs" / "tasks" / "video_lora" / "ltx2_tiny.yaml"
PROMPT = "a red ball rolls"


def _run(root: Path, mode: str, steps: int) -> Path:
    overrides = [f"output_dir={root / mode}", f"data.cache.dir={root / 'cache'}", "train.num_workers=0"]
    overrides += [f"model.base.mode={mode}", f"train.length.steps={steps}"]
    overrides += [f"train.eval.every.steps={steps}", "train.checkpoint.every=null"]
    train_in_process(CONFIG, overrides)
    return root / mode


@pytest.fixture(scope="module")
def ltx2_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ltx2_tiny.yaml as shipped (interpolation, 30 steps) and a 4-step image_to_video run (a LoRA
    moved off its zero init is all the i2v parity needs)."""
    root = tmp_path_factory.mktemp("ltx2_run")
    return {
        "interpolation": _run(root, "interpolation", 30),
        "image_to_video": _run(root, "image_to_video", 4),
    }


def _image(path: Path, seed: int) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


@pytest.mark.slow  # the module's two training runs: ~25 s on 2 cores
def test_ltx2_tiny_loss_falls_and_final_holds_the_diffusers_layout(ltx2_runs: dict[str, Path]) -> None:
    run = ltx2_runs["interpolation"]
    train = read_metrics(run)[0]
    first, last = np.mean([x["loss"] for x in train[:5]]), np.mean([x["loss"] for x in train[-5:]])
    assert last < 0.95 * first, (first, last)  # measured 1.35 -> 1.11 (lr 3e-3, 30 steps, 12 fps clips)
    from safetensors.torch import load_file

    keys = sorted(load_file(str(run / "final" / "pytorch_lora_weights.safetensors")))
    assert keys and all(k.startswith("transformer.transformer_blocks.") for k in keys)
    assert "transformer.transformer_blocks.0.attn1.to_q.lora_A.weight" in keys
    assert not [k for k in keys if "audio" in k]  # video only: the audio branch stays frozen
    record = json.loads((run / "final" / "framer_ds_video_lora.json").read_text())
    assert record["base"] == "ltx2" and record["mode"] == "interpolation"
    # the rate it trained at (the synthetic clips: 12 fps at stride 1), `framer-ds sample`'s default
    assert (record["fps"], record["fps_range"]) == (12.0, [12.0, 12.0])


def _pipeline_frames(pipe, mode: str, first: Path, last: Path, frame_rate: float) -> np.ndarray:
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

    kwargs = {
        "prompt": PROMPT,
        "num_frames": 9,
        "height": 64,
        "width": 64,
        "num_inference_steps": 3,
        "frame_rate": frame_rate,
        "generator": torch.Generator("cpu").manual_seed(0),
        "output_type": "np",
    }
    if mode == "interpolation":
        conditions = [
            LTX2VideoCondition(frames=Image.open(first).convert("RGB"), index=0),
            LTX2VideoCondition(frames=Image.open(last).convert("RGB"), index=-1),
        ]
        return pipe(conditions=conditions, **kwargs).frames[0]
    return pipe(image=Image.open(first).convert("RGB"), **kwargs).frames[0]


@pytest.mark.slow  # the module's two training runs: ~25 s on 2 cores
@pytest.mark.parametrize("mode", ["interpolation", "image_to_video"])
def test_framer_ds_sample_equals_the_diffusers_pipeline_with_load_lora_weights(
    ltx2_runs: dict[str, Path], mode: str, tmp_path: Path
) -> None:
    """The done-when test of issue 50: same seed and inputs, max abs <= 1e-3 (both run the same float32
    operations on the CPU: measured 0.0), and the LoRA matters (without it the frames differ). With no
    --fps, `framer-ds sample` runs at the rate training saw (the export's `fps`: 12, the clips')."""
    from diffusers import LTX2ConditionPipeline, LTX2ImageToVideoPipeline

    from framer_ds.cli.main import main

    final = ltx2_runs[mode] / "final"
    first, last = _image(tmp_path / "a.png", 1), _image(tmp_path / "b.png", 2)
    out, frames = tmp_path / "x.mp4", tmp_path / "x.npy"
    args = ["sample", str(final), "--image", str(first), "--prompt", PROMPT, "--num-frames", "9"]
    args += ["--last-image", str(last)] if mode == "interpolation" else []
    args += [
        "--steps",
        "3",
        "--seed",
        "0",
        "--out",
        str(out),
        "--save-frames",
        str(frames),
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    ours = np.load(frames)
    metadata = json.loads((final / "framer_ds_video_lora.json").read_text())
    base, rate = metadata["base_model"], metadata["fps"]
    pipeline = LTX2ConditionPipeline if mode == "interpolation" else LTX2ImageToVideoPipeline
    pipe = pipeline.from_pretrained(base)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(final)
    theirs = _pipeline_frames(pipe, mode, first, last, rate)
    assert ours.shape == theirs.shape == (9, 64, 64, 3)
    assert np.abs(ours - theirs).max() <= 1e-3
    pipe.unload_lora_weights()
    assert np.abs(_pipeline_frames(pipe, mode, first, last, rate) - theirs).max() > 1e-3
    record = json.loads((tmp_path / "x.json").read_text())
    assert record["base"] == "ltx2" and record["prompt"] == PROMPT and record["seed"] == 0
    assert rate == 12.0 and record["fps"] == 12.0


@pytest.mark.slow  # the module's two training runs: ~25 s on 2 cores
def test_a_complete_cache_never_loads_an_encoder(
    ltx2_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two more steps on the filled cache with every encoder load made to fail: Gemma stays on disk."""
    from framer_ds.tasks.video_lora.ltx2.encoders import FrozenLtx2Encoders

    def refuse(self):
        raise AssertionError("an encoder was loaded although the latent cache is complete")

    monkeypatch.setattr(FrozenLtx2Encoders, "load", refuse)
    root = ltx2_runs["interpolation"].parent
    overrides = [
        f"output_dir={tmp_path / 'again'}",
        f"data.cache.dir={root / 'cache'}",
        "train.length.steps=2",
    ]
    overrides += ["train.eval.every=null", "train.checkpoint.every=null", "train.num_workers=0"]
    train_in_process(CONFIG, overrides)
    assert len(read_metrics(tmp_path / "again")[0]) >= 1


def test_ltx2_states_its_own_size_and_frame_rules(tmp_path: Path) -> None:
    """LTX-2's rules come from its folder (the tiny VAE: 8 px, 2 frames a latent frame; LTX-2's own
    32 px and 1 + 8k before a folder exists), and `validate` names each violation with the fix."""
    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.tasks.video_lora.families import family_for

    config = load_run_config(CONFIG, [f"output_dir={tmp_path / 'run'}"])
    family = family_for(config)
    family.prepare()
    assert (family.size_multiple(), family.temporal_factor(), family.frame_grid()) == (8, 2, (1, 2))
    assert family.frame_count_problem(8) == "LTX-2's VAE needs 1 + a multiple of 2 frames, got 8: use 9"
    absent = load_run_config(CONFIG, [f"output_dir={tmp_path / 'r'}", f"model.base.source.path={tmp_path}"])
    assert (family_for(absent).size_multiple(), family_for(absent).min_frames()) == (32, 9)
    from framer_ds.tasks.registry import get_task_class

    bad = load_run_config(CONFIG, [f"output_dir={tmp_path / 'b'}", "data.num_frames=8", "data.height=68"])
    problems = [str(p) for p in get_task_class("video_lora")(bad).check()]
    assert "data.num_frames: LTX-2's VAE needs 1 + a multiple of 2 frames, got 8: use 9" in problems
    assert [p for p in problems if p.startswith("data.height") and "8" in p], problems
    # interp_eval needs the last frame, and clip_distance a CLIP image encoder LTX-2 does not have
    i2v = ["model.base.mode=image_to_video", "model.interp_eval.enabled=true", f"output_dir={tmp_path / 'c'}"]
    problems = [str(p) for p in get_task_class("video_lora")(load_run_config(CONFIG, i2v)).check()]
    assert [p for p in problems if p.startswith("model.interp_eval.enabled:") and "no last frame" in p]
    assert [p for p in problems if p.startswith("model.interp_eval.clip_distance:") and "set false" in p]


def test_an_ltx2_export_takes_the_text_flags_and_refuses_wans_own(tmp_path: Path) -> None:
    """`--prompt` (declared by Wan's flags and LTX-2's) is an LTX-2 export's own, not "a Wan flag" (the
    refusal skipped no flag a family shares before issue 50); `--other-expert` (Wan 2.2's) is refused in
    one line naming the export's base."""
    from framer_ds.config.errors import ConfigError
    from framer_ds.tasks.video_lora.config import VideoSampleCommandOptions
    from framer_ds.tasks.video_lora.shared.exports import refuse_foreign_flags
    from framer_ds.tasks.video_lora.shared.options import TextSampleFlags

    common = {"image": tmp_path / "a.png", "out": tmp_path / "x.mp4", "prompt": PROMPT, "guidance_scale": 3.0}
    refuse_foreign_flags(VideoSampleCommandOptions(**common), "ltx2", (TextSampleFlags,))
    wan_only = VideoSampleCommandOptions(**common, other_expert=tmp_path)
    with pytest.raises(ConfigError, match="--other-expert: a Wan flag; this export's base is 'ltx2'"):
        refuse_foreign_flags(wan_only, "ltx2", (TextSampleFlags,))
    # the text flags are declared once (TextSampleFlags): an SVD export names them as the text bases'
    from framer_ds.tasks.video_lora.svd.options import SvdSampleFlags

    text_bases = "--prompt: a flag of the text-conditioned bases .Wan, LTX-2.; this export's base is 'svd'"
    with pytest.raises(ConfigError, match=text_bases):
        refuse_foreign_flags(VideoSampleCommandOptions(**common), "svd", (SvdSampleFlags,))
