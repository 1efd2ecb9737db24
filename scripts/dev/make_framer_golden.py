"""Regenerate tests/golden/framer/: what Framer's OWN code computes on a tiny Framer-layout model.

Upstream: https://github.com/aim-uofa/Framer at commit d0ba81f1f23a639396d4c6a801c53a5b21412b06 (its
`models_diffusers/` UNet, ControlNet and temporal transformer, and `pipelines/pipeline_stable_video_
diffusion_interp_control.py`'s `StableVideoDiffusionInterpControlPipeline`). Nothing of it is vendored:
this script extracts those two folders from a clone into a temp dir and imports them from there.

    git clone https://github.com/aim-uofa/Framer /tmp/Framer   # or a bare mirror of it
    python scripts/dev/make_framer_golden.py --framer /tmp/Framer

Patches, all at import time and none to the computation. Framer pins diffusers 0.24; the installed
diffusers moved or dropped some names Framer imports at module level, only for code paths not run here
(its custom `from_pretrained`, the PEFT / Flax loaders, SIFT tracking):
- `diffusers.models.dual_transformer_2d` and `diffusers.models.transformer_2d` are aliased to their
  new homes under `diffusers.models.transformers`;
- `diffusers.loaders.FromOriginalControlnetMixin` is `FromOriginalModelMixin` (a loader mixin, unused);
- `DIFFUSERS_CACHE`, `FLAX_WEIGHTS_NAME`, `HF_HUB_OFFLINE` (diffusers.utils) and
  `load_model_dict_into_meta` (modeling_utils) get placeholders that raise if anything calls them;
- `cv2` (OpenCV, for SIFT tracking and heatmap drawing) is an empty module, and the pipeline's
  `generate_gassian_heatmap` is replaced by a function returning the stored heatmaps, because drawing
  them needs OpenCV; how framer_ds draws Framer's heatmaps is tested on its own
  (tests/test_framer_sampling.py). The ControlNet then runs on those heatmaps exactly as in Framer.

The tiny model (stored in full, fp32, so the test needs no builder of ours to agree with this one):
framer_ds's tiny SVD (VAE, CLIP image encoder, scheduler) with a smaller UNet, made into Framer's layout
by `framer/tiny.build_tiny_framer` (9-channel conv_in, mask_token, ControlNet with random output convs),
all from `--seed`. Outputs (`tests/golden/framer/`):
- `model/` (unet/, controlnet/, vae/, image_encoder/, feature_extractor/, scheduler/): the weights;
- `unet_cfg.safetensors`: one UNet forward at batch 2 as classifier-free guidance feeds it
  (unconditional half: zero CLIP contexts and zero first/last latents; conditional: random), with and
  without ControlNet residuals: inputs and Framer's outputs;
- `sampler.safetensors`: the pipeline end to end (2 Euler steps, guidance 1 -> 3 middle_max, the
  ControlNet on the stored heatmaps): the first/last frames, the final latents and decoded frames;
- `golden.json`: the upstream commit, the seeds and the sampler settings.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

import torch

COMMIT = "d0ba81f1f23a639396d4c6a801c53a5b21412b06"
OUT = Path(__file__).resolve().parents[2] / "tests" / "golden" / "framer"
# A UNet smaller than tiny_svd's (its UNet file alone would be 5 MB; 32 channels is the least diffusers'
# GroupNorm(32) allows): one cross-attention level (spatial + temporal transformers, at 8x8 latents) down
# and up, around the mid block (also spatio-temporal).
UNET_OVERRIDES = {
    "down_block_types": ("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
    "up_block_types": ("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
    "block_out_channels": (32, 32),
    "num_attention_heads": (2, 2),
    "addition_time_embed_dim": 8,
    "projection_class_embeddings_input_dim": 24,
}
SAMPLER = {
    "num_frames": 4,
    "height": 64,
    "width": 64,
    "num_inference_steps": 2,
    "min_guidance_scale": 1.0,
    "max_guidance_scale": 3.0,
    "middle_max_guidance": True,
    "fps": 7,
    "motion_bucket_id": 127,
    "noise_aug_strength": 0.02,
    "controlnet_cond_scale": 1.0,
    "generator_seed": 3,
}


def extract_framer(source: Path, dest: Path) -> Path:
    """Framer's models_diffusers/ and pipelines/ at COMMIT from a clone or bare mirror into dest."""
    git_dir = source / ".git" if (source / ".git").exists() else source
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", "--format=tar", COMMIT, "models_diffusers", "pipelines"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _unavailable(name: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{name} is a placeholder of make_framer_golden.py (not in this diffusers)")

    return fail


def import_framer(src: Path) -> types.SimpleNamespace:
    """Framer's UNet, ControlNet and pipeline modules, imported with the patches of the docstring."""
    import diffusers.loaders
    import diffusers.models.modeling_utils
    import diffusers.utils

    sys.modules["cv2"] = types.ModuleType("cv2")
    for old, new in (
        ("dual_transformer_2d", "transformers.dual_transformer_2d"),
        ("transformer_2d", "transformers.transformer_2d"),
    ):
        sys.modules[f"diffusers.models.{old}"] = importlib.import_module(f"diffusers.models.{new}")
    diffusers.loaders.FromOriginalControlnetMixin = diffusers.loaders.FromOriginalModelMixin
    for module, names in (
        (diffusers.utils, ("DIFFUSERS_CACHE", "FLAX_WEIGHTS_NAME", "HF_HUB_OFFLINE")),
        (diffusers.models.modeling_utils, ("load_model_dict_into_meta",)),
    ):
        for name in names:
            if not hasattr(module, name):
                setattr(module, name, _unavailable(name))
    sys.path.insert(0, str(src))
    return types.SimpleNamespace(
        unet=importlib.import_module("models_diffusers.unet_spatio_temporal_condition"),
        controlnet=importlib.import_module("models_diffusers.controlnet_svd"),
        pipeline=importlib.import_module("pipelines.pipeline_stable_video_diffusion_interp_control"),
    )


def build_tiny_model(out: Path, seed: int) -> None:
    """The tiny Framer + SVD components into out/ (fp32 safetensors, diffusers layout)."""
    import shutil

    from framer_ds.tasks.video_lora.framer.tiny import build_tiny_framer
    from framer_ds.tasks.video_lora.svd.tiny import create_tiny_svd

    with tempfile.TemporaryDirectory() as tmp:
        svd = create_tiny_svd(Path(tmp) / "svd", seed=seed, unet_overrides=UNET_OVERRIDES)
        unet, controlnet = build_tiny_framer(svd, seed=seed)
        unet.save_pretrained(out / "unet", safe_serialization=True)
        controlnet.save_pretrained(out / "controlnet", safe_serialization=True)
        for part in ("vae", "image_encoder", "feature_extractor", "scheduler"):
            shutil.copytree(svd / part, out / part)
        shutil.copy2(svd / "model_index.json", out / "model_index.json")
    for config in out.glob("*/config.json"):  # the temp dir's name would change on every run
        values = json.loads(config.read_text())
        values.pop("_name_or_path", None)
        config.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")


def load_framers_models(framer: types.SimpleNamespace, model_dir: Path):
    """The tiny weights into Framer's own classes (its constructors from our config.json; its UNet's
    __init__ registers mask_token, which the state dict then sets)."""
    from safetensors.torch import load_file

    models = []
    for cls, name in (
        (framer.unet.UNetSpatioTemporalConditionModel, "unet"),
        (framer.controlnet.ControlNetSVDModel, "controlnet"),
    ):
        model = cls.from_config(cls.load_config(model_dir / name))
        state = load_file(str(model_dir / name / "diffusion_pytorch_model.safetensors"))
        model.load_state_dict(state, strict=True)
        models.append(model.eval())
    return models


@torch.no_grad()
def unet_cfg_golden(unet, controlnet, seed: int) -> dict[str, torch.Tensor]:
    """One guided UNet forward (batch 2: unconditional, conditional), without and with the ControlNet,
    as Framer's pipeline calls them (lines 590-625)."""
    g = torch.Generator().manual_seed(seed)
    f, c, h, w = SAMPLER["num_frames"], 4, SAMPLER["height"] // 8, SAMPLER["width"] // 8
    dim = unet.config.cross_attention_dim
    context = torch.cat([torch.zeros(1, 2, dim), torch.randn(1, 2, dim, generator=g)])
    cond = torch.randn(1, 2, c, h, w, generator=g)  # first / last latents of the conditional half
    latents = torch.cat([cond * 0, cond])
    middle = unet.mask_token.expand(2, f - 2, c, h, w)
    cond_latents = torch.cat([latents[:, :1], middle, latents[:, 1:]], dim=1)
    mask = torch.ones(2, f, 1, h, w)
    mask[:, [0, -1]] = 0
    noisy = torch.randn(1, f, c, h, w, generator=g).repeat(2, 1, 1, 1, 1)
    inputs = {
        "sample": torch.cat([noisy, cond_latents, mask], dim=2),
        "timestep": torch.tensor(0.7),
        "encoder_hidden_states": context,
        "added_time_ids": torch.tensor([[6.0, 127.0, 0.02]] * 2),
        "controlnet_cond": torch.rand(1, f, 3, SAMPLER["height"], SAMPLER["width"], generator=g).repeat(
            2, 1, 1, 1, 1
        ),
    }
    common = {k: inputs[k] for k in ("encoder_hidden_states", "added_time_ids")}
    plain = unet(inputs["sample"], inputs["timestep"], return_dict=False, **common)[0]
    down, mid = controlnet(
        inputs["sample"],
        inputs["timestep"],
        controlnet_cond=inputs["controlnet_cond"],
        conditioning_scale=SAMPLER["controlnet_cond_scale"],
        return_dict=False,
        **common,
    )
    controlled = unet(
        inputs["sample"],
        inputs["timestep"],
        down_block_additional_residuals=down,
        mid_block_additional_residual=mid,
        return_dict=False,
        **common,
    )[0]
    return {**inputs, "out_unet": plain, "out_unet_controlnet": controlled}


@torch.no_grad()
def sampler_golden(framer, unet, controlnet, model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """Framer's pipeline end to end on two random frames and random heatmaps: final latents (its
    output_type 'latent') and those latents decoded by its own `decode_latents`."""
    from diffusers import AutoencoderKLTemporalDecoder, EulerDiscreteScheduler
    from PIL import Image
    from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

    g = torch.Generator().manual_seed(seed)
    f, height, width = SAMPLER["num_frames"], SAMPLER["height"], SAMPLER["width"]
    pixels = (torch.rand(2, height, width, 3, generator=g) * 255).round().to(torch.uint8)
    heatmaps = torch.rand(f, 3, height, width, generator=g)
    framer.pipeline.generate_gassian_heatmap = lambda *args, **kwargs: heatmaps.clone()
    pipe = framer.pipeline.StableVideoDiffusionInterpControlPipeline(
        vae=AutoencoderKLTemporalDecoder.from_pretrained(model_dir / "vae"),
        image_encoder=CLIPVisionModelWithProjection.from_pretrained(model_dir / "image_encoder"),
        unet=unet,
        scheduler=EulerDiscreteScheduler.from_pretrained(model_dir / "scheduler"),
        feature_extractor=CLIPImageProcessor.from_pretrained(model_dir / "feature_extractor"),
        controlnet=controlnet,
    )
    images = [Image.fromarray(p.numpy()) for p in pixels]
    settings = {k: v for k, v in SAMPLER.items() if k != "generator_seed"}
    latents = pipe(
        images[0],
        images[1],
        with_control=True,
        point_tracks=torch.zeros(f, 1, 2),
        generator=torch.Generator().manual_seed(SAMPLER["generator_seed"]),
        output_type="latent",
        return_dict=False,
        decode_chunk_size=f,
        **settings,
    )
    frames = pipe.decode_latents(latents, f, f)  # [1, 3, F, H, W] in [-1, 1] (before tensor2vid)
    return {
        "pixels": pixels,
        "heatmaps": heatmaps,
        "latents": latents,
        "frames": frames,
    }


def main() -> None:
    from safetensors.torch import save_file

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--framer", type=Path, required=True, help="a clone (or bare mirror) of aim-uofa/Framer"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as tmp:
        framer = import_framer(extract_framer(args.framer, Path(tmp)))
        if args.out.exists():
            import shutil

            shutil.rmtree(args.out)
        build_tiny_model(args.out / "model", args.seed)
        unet, controlnet = load_framers_models(framer, args.out / "model")
        save_file(unet_cfg_golden(unet, controlnet, args.seed + 1), str(args.out / "unet_cfg.safetensors"))
        sampled = sampler_golden(framer, unet, controlnet, args.out / "model", args.seed + 2)
        save_file({k: v.contiguous() for k, v in sampled.items()}, str(args.out / "sampler.safetensors"))
    meta = {
        "upstream": "https://github.com/aim-uofa/Framer",
        "commit": COMMIT,
        "seed": args.seed,
        "unet_overrides": UNET_OVERRIDES,
        "sampler": SAMPLER,
        "regenerate": "python scripts/dev/make_framer_golden.py --framer CLONE_OF_aim-uofa/Framer",
    }
    (args.out / "golden.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
