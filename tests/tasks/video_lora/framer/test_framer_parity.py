"""A Framer base computes what Framer's own code computes: golden outputs of aim-uofa/Framer (d0ba81f; its
UNet, ControlNet and `StableVideoDiffusionInterpControlPipeline`, run once on a tiny Framer-layout
model by scripts/dev/make_framer_golden.py) reproduced by framer_ds, loaded through its own loading
paths from the stored model directory (tests/golden/framer/model).

The point of these cases is the temporal cross-attention context (svd/temporal_context.py):
Framer pairs pixel row r of a batch of B with the context of item r mod B, diffusers with its own
item's. Under classifier-free guidance (batch 2: unconditional, conditional) the two differ, so each
golden case also runs with diffusers' order forced and must then miss the golden output.

Tolerance 1e-4: everything runs in fp32 on CPU with the same weights and inputs; framer_ds runs the
same operations as Framer, some in another order (diffusers' current attention and block code for
Framer's diffusers-0.24 fork, the ControlNet residuals added by hooks). The UNet forward agrees to
fp32 rounding; end to end, our noise augmentation (a float32 sigma tensor where the pipeline
multiplies by a Python float) moves the conditioning latents by ~1e-6, which two Euler steps and the
random tiny VAE decoder amplify to ~4e-5 on frames in [0, 1]. The wrong order moves them by ~0.1.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.video_lora.framer.conditioning import FramerSampling
from framer_ds.tasks.video_lora.framer.sampling import framer_sampler_parts
from framer_ds.tasks.video_lora.svd.sampling import sample_video
from framer_ds.tasks.video_lora.svd.temporal_context import set_temporal_context_order, temporal_context_order
from framer_ds.tasks.video_lora.task import VideoLoraTask

GOLDEN = REPO / "tests" / "golden" / "framer"
MODEL = GOLDEN / "model"
FRAMER_TINY = REPO / "configs" / "tasks" / "video_lora" / "framer_tiny.yaml"
TOLERANCE = 1e-4
WRONG_ORDER_AT_LEAST = 1e-2  # the diffusers order misses the golden output by far more (~0.1)


def export_metadata(**extra) -> dict:
    """What a Framer run's final/ records (framer_ds_video_lora.json), for the stored tiny model."""
    return {
        "base": "framer",
        "framer_path": str(MODEL),
        "base_model": str(MODEL),
        "has_adapter": False,
        "has_controlnet": False,
        "controlnet_cond_scale": 1.0,
        "controlnet_step_range": [0.0, 1.0],
        **extra,
    }


@pytest.fixture(scope="module")
def golden_unet() -> dict[str, torch.Tensor]:
    return load_file(GOLDEN / "unet_cfg.safetensors")


@pytest.fixture(scope="module")
def sampler_parts():
    """`framer-ds sample`'s model for an export of the stored base (loads unet/, controlnet/, VAE, CLIP
    and scheduler from the directory, as for a release)."""
    return framer_sampler_parts(GOLDEN, export_metadata(), "cpu", torch.float32)


@torch.no_grad()
def guided_forward(model, golden: dict[str, torch.Tensor], controlnet: bool) -> torch.Tensor:
    control = {"controlnet_cond": golden["controlnet_cond"]} if controlnet else {}
    return model(
        golden["sample"],
        golden["timestep"],
        encoder_hidden_states=golden["encoder_hidden_states"],
        added_time_ids=golden["added_time_ids"],
        return_dict=False,
        **control,
    )[0]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def test_golden_inputs_are_a_guided_batch(golden_unet):
    """The case can tell the orders apart only if the two halves' contexts differ."""
    context = golden_unet["encoder_hidden_states"]
    assert context.shape[0] == 2 and context[0].eq(0).all() and context[1].ne(0).any()
    assert json.loads((GOLDEN / "golden.json").read_text())["commit"].startswith("d0ba81f")


@pytest.mark.parametrize("controlnet", [False, True], ids=["unet", "unet_controlnet"])
def test_sampling_model_reproduces_framers_guided_unet_forward(sampler_parts, golden_unet, controlnet):
    model = sampler_parts[0].denoiser
    assert temporal_context_order(model) == "framer"  # the export's base decides
    expected = golden_unet["out_unet_controlnet" if controlnet else "out_unet"]
    assert max_diff(guided_forward(model, golden_unet, controlnet), expected) <= TOLERANCE
    try:
        set_temporal_context_order(model, "diffusers")
        assert max_diff(guided_forward(model, golden_unet, controlnet), expected) > WRONG_ORDER_AT_LEAST
    finally:
        set_temporal_context_order(model, "framer")


def framer_sample(parts, framer: FramerSampling, golden: dict[str, torch.Tensor]) -> torch.Tensor:
    settings = json.loads((GOLDEN / "golden.json").read_text())["sampler"]
    first, last = (p.permute(2, 0, 1).float() / 255 * 2 - 1 for p in golden["pixels"])
    framer.controlnet_cond = golden["heatmaps"][None]
    frames = sample_video(
        parts, first, last, settings["num_frames"], settings["fps"], settings["motion_bucket_id"],
        settings["noise_aug_strength"], settings["num_inference_steps"], settings["min_guidance_scale"],
        settings["max_guidance_scale"], torch.Generator().manual_seed(settings["generator_seed"]),
        decode_chunk_size=settings["num_frames"], conditioning=framer, guidance_schedule="middle_max",
    )  # fmt: skip
    return (frames + 1) / 2  # [0, 1], as the issue measured


def test_sampler_reproduces_framers_pipeline_end_to_end(sampler_parts):
    parts, framer = sampler_parts
    golden = load_file(GOLDEN / "sampler.safetensors")
    expected = (golden["frames"][0].permute(1, 0, 2, 3).clamp(-1, 1) + 1) / 2  # [F,3,H,W] in [0,1]
    assert max_diff(framer_sample(parts, framer, golden), expected) <= TOLERANCE
    try:
        set_temporal_context_order(parts.denoiser, "diffusers")
        assert max_diff(framer_sample(parts, framer, golden), expected) > WRONG_ORDER_AT_LEAST
    finally:
        set_temporal_context_order(parts.denoiser, "framer")


def test_export_records_the_order_and_sampling_follows_it(golden_unet):
    """An export that trained with diffusers' order (the config key) samples with it; one written
    before the key existed samples with its base's order."""
    forced = framer_sampler_parts(
        GOLDEN, export_metadata(temporal_context_order="diffusers"), "cpu", torch.float32
    )
    assert temporal_context_order(forced[0].denoiser) == "diffusers"
    assert (
        max_diff(guided_forward(forced[0].denoiser, golden_unet, False), golden_unet["out_unet"])
        > WRONG_ORDER_AT_LEAST
    )


def training_task(tmp_path, *overrides) -> VideoLoraTask:
    """framer_tiny.yaml on the stored model directories (no build, no data)."""
    config = load_run_config(
        FRAMER_TINY,
        [
            f"output_dir={tmp_path / 'run'}",
            "model.source.builtin=null",
            f"model.source.path={MODEL}",
            "model.base.source.builtin=null",
            f"model.base.source.path={MODEL}",
            *overrides,
        ],
    )
    return VideoLoraTask(config)


@pytest.mark.parametrize("order", [None, "diffusers"], ids=["base_default", "config_key"])
def test_training_model_runs_the_configured_order(tmp_path, golden_unet, order):
    """`build_model` (what training, eval and validation samples run): Framer's order by default on a
    Framer base, reproducing Framer's forward (the fresh LoRA adds exactly 0); diffusers' when
    `model.temporal_context_order` says so, and the export metadata records which."""
    from framer_ds.tasks.video_lora.svd.export import export_metadata as metadata_of

    task = training_task(tmp_path, *([f"model.temporal_context_order={order}"] if order else []))
    model = task.build_model().eval()
    expected = order or "framer"
    assert temporal_context_order(model) == expected
    assert (
        metadata_of(task.config, MODEL, [], None, task.family.conv_in_extra_channels())[
            "temporal_context_order"
        ]
        == expected
    )
    diff = max_diff(guided_forward(model, golden_unet, True), golden_unet["out_unet_controlnet"])
    assert diff <= TOLERANCE if order is None else diff > WRONG_ORDER_AT_LEAST


def test_framer_time_context_is_framers_broadcast():
    """On a tiny tensor: Framer's lines 313-322 (verbatim but for names) give row r the context of item
    r mod B; diffusers' gives rows b*h*w .. (b+1)*h*w - 1 item b's; `framer_time_context` turns the
    latter into the former. At batch 1 there is nothing to mix."""
    from framer_ds.tasks.video_lora.svd.temporal_context import framer_time_context

    for batch in (1, 2, 3):
        frames, pixels, seq, dim = 3, 4, 2, 5
        encoder_hidden_states = torch.randn(batch * frames, seq, dim)
        first = encoder_hidden_states[None, :].reshape(batch, frames, -1, dim)[:, 0]
        framers = first[None, :].broadcast_to(pixels, batch, -1, dim).reshape(pixels * batch, -1, dim)
        diffusers = first[:, None].broadcast_to(batch, pixels, seq, dim).reshape(batch * pixels, -1, dim)
        assert torch.equal(framer_time_context(diffusers, pixels), framers)
        assert torch.equal(framers, diffusers) == (batch == 1)
        rows = torch.arange(pixels * batch)
        assert torch.equal(framers, first[rows % batch])


def test_stock_svd_runs_diffusers_order_unless_the_key_says_framer(tmp_path):
    """`base: svd` trains with diffusers' order; `model.temporal_context_order: framer` trains with
    Framer's, records it, and `framer-ds sample`'s SVD pipeline loads the export with it."""
    from framer_ds.storage.atomic import atomic_write_json
    from framer_ds.tasks.video_lora.shared.exports import EXPORT_METADATA
    from framer_ds.tasks.video_lora.svd.export import export_context_order, load_pipeline_with_adapter
    from framer_ds.tasks.video_lora.svd.export import export_metadata as metadata_of
    from framer_ds.tasks.video_lora.svd.tiny import create_tiny_svd

    tiny = REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml"
    stock = VideoLoraTask(load_run_config(tiny, [f"output_dir={tmp_path / 'a'}"]))
    create_tiny_svd(stock.family.svd_path())
    assert temporal_context_order(stock.build_model()) == "diffusers"
    task = VideoLoraTask(
        load_run_config(tiny, [f"output_dir={tmp_path / 'b'}", "model.temporal_context_order=framer"])
    )
    model = task.build_model()
    assert temporal_context_order(model) == "framer"
    metadata = metadata_of(
        task.config, task.family.svd_path(), [], None, task.family.conv_in_extra_channels()
    )
    model.save_pretrained(tmp_path / "adapter")
    atomic_write_json(tmp_path / "adapter" / EXPORT_METADATA, metadata)
    pipe, _ = load_pipeline_with_adapter(tmp_path / "adapter", "cpu", torch.float32)
    assert temporal_context_order(pipe.unet) == "framer"
    # exports written before the key existed: the base's own order
    assert export_context_order({"base": "svd"}) == "diffusers"
    assert export_context_order({"base": "framer"}) == "framer"
