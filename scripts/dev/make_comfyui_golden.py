"""Writes `tests/golden/comfyui/`: what ComfyUI's own LoRA loader does with `export --format comfyui`.

ComfyUI's code is run, not re-implemented: its SVD model class (`comfy.supported_models.SVD_img2vid` ->
`comfy.model_base.SVD_img2vid`, whose UNet is `openaimodel.UNetModel` with the temporal blocks) is
built at the tiny SVD's size, and our exported file goes through the LoraLoaderModelOnly node's path:
`comfy.utils.load_torch_file` -> `comfy.sd.load_lora_for_models` (`comfy.lora.model_lora_keys_unet`
builds the accepted key map, `comfy.lora_convert.convert_lora`, `comfy.lora.load_lora` matches keys and
logs "lora key not loaded" for the rest) -> `ModelPatcher.patch_model()` writes the patched weights.

Upstream: comfyanonymous/ComfyUI master as of 2026-01-07 ("Support gemma 12B with quant weights.",
3cd7b32f), taken from the fork pollockjj/ComfyUI at its merge commit 618b803d314a525faca8f8163d85eaa9ebc1d774
(the fetch tool refuses comfyanonymous/ComfyUI itself: over its 500 MB limit; the fork's HEAD merges
that upstream commit, and `model_lora_keys_unet`'s generic-format lines are the same as upstream's
41444b52). Make the checkout (Python files only; the repository's large data files are not needed):

    G="git --git-dir=/work/.mirror/pollockjj+ComfyUI/repo"; C=618b803d314a525faca8f8163d85eaa9ebc1d774
    PY='^(comfy|comfy_api|comfy_extras|comfy_execution|comfy_config)/.*\\.py$|^[a-z_]+\\.py$'
    $G ls-tree -r --name-only $C | grep -E "$PY" \\
      | while read f; do mkdir -p /tmp/comfyui/$(dirname $f); $G show $C:$f > /tmp/comfyui/$f; done
    python scripts/dev/make_comfyui_golden.py --comfyui /tmp/comfyui

Patches at run time, none to ComfyUI's files: `torchvision` (imported by an unrelated model,
`comfy/ldm/cosmos`, through `comfy.model_base`; not installed here) is a stub module; ComfyUI runs with
`--cpu`; the model's weights are zeros before patching, so a patched weight IS ComfyUI's delta.

Inputs stored (the test rebuilds nothing from ComfyUI): for each adapter variant ("plain": r 4, alpha 11;
"rslora": r 8, alpha 11, rsLoRA scaling), peft's saved adapter (`adapter_<v>.safetensors` +
`adapter_config_<v>.json`, made with peft on the tiny SVD UNet, random lora_B so the delta is non-zero),
our export of it, and ComfyUI's output: `keys.json` (ComfyUI's model weights, its UNet LoRA key map, its
own diffusers -> ComfyUI names, which keys of our file it loaded) and `deltas_<v>.safetensors` (the
weights ComfyUI changed, as patched). Run from the repository root; the output is deterministic.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import logging
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch
from diffusers import UNetSpatioTemporalConditionModel
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from safetensors.torch import load_file, save_file

from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.svd.comfyui_keys import comfyui_lora_state_dict
from framer_ds.tasks.video_lora.svd.options import ATTENTION_TARGETS, FEED_FORWARD_TARGETS, PROJECTION_TARGETS
from framer_ds.tasks.video_lora.svd.tiny import create_tiny_svd

OUT = Path(__file__).resolve().parents[2] / "tests" / "golden" / "comfyui"
UPSTREAM = {
    "repo": "comfyanonymous/ComfyUI (via the fork pollockjj/ComfyUI)",
    "commit": "618b803d314a525faca8f8163d85eaa9ebc1d774",
    "upstream_commit": "3cd7b32f",
}
ALPHA = 11.0
# alpha != rank in both; rsLoRA at rank 8 makes peft's scale alpha / sqrt(8) irrational, so the alpha we
# write (scale * rank, a float32) is rounded: the test's tolerance covers exactly that
VARIANTS = {"plain": {"r": 4}, "rslora": {"r": 8, "use_rslora": True}}


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `import torchvision...` with a MagicMock module: ComfyUI imports it for models unused here."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__ = [], spec
        return module

    def exec_module(self, module) -> None:
        return None


def import_comfyui(checkout: Path):
    sys.meta_path.insert(0, _StubFinder())
    sys.path.insert(0, str(checkout))
    import comfy.options

    comfy.options.enable_args_parsing()
    argv, sys.argv = sys.argv, ["comfyui", "--cpu"]
    import comfy.model_detection
    import comfy.model_management
    import comfy.model_patcher
    import comfy.sd
    import comfy.supported_models
    import comfy.utils

    sys.argv = argv
    return comfy


def tiny_unet_config(diffusers_config: dict) -> dict:
    """The tiny diffusers SVD UNet in ComfyUI's UNetModel terms (SVD_img2vid's own keys, at tiny size):
    attention in down block 0, the mid block and the last up block, as the diffusers block types say."""
    levels = len(diffusers_config["block_out_channels"])
    per_level = diffusers_config["layers_per_block"]
    down_attn = [t.startswith("CrossAttn") for t in diffusers_config["down_block_types"]]
    up_attn = [t.startswith("CrossAttn") for t in diffusers_config["up_block_types"]]
    base = diffusers_config["block_out_channels"][0]
    heads = diffusers_config["num_attention_heads"]
    head_dims = {c // h for c, h in zip(diffusers_config["block_out_channels"], heads, strict=True)}
    assert len(head_dims) == 1, "ComfyUI's num_head_channels is one value"
    return {
        "model_channels": base,
        "in_channels": diffusers_config["in_channels"],
        "out_channels": diffusers_config["out_channels"],
        "use_linear_in_transformer": True,
        "num_res_blocks": [per_level] * levels,
        "channel_mult": [c // base for c in diffusers_config["block_out_channels"]],
        "transformer_depth": [int(a) for a in down_attn for _ in range(per_level)],
        # UNetModel pops this list from the end, deepest level first: it runs shallow -> deep
        "transformer_depth_output": [int(a) for a in reversed(up_attn) for _ in range(per_level + 1)],
        "transformer_depth_middle": 1,
        "context_dim": diffusers_config["cross_attention_dim"],
        "adm_in_channels": diffusers_config["projection_class_embeddings_input_dim"],
        "num_classes": "sequential",
        "use_temporal_attention": True,
        "use_temporal_resblock": True,
        # what comfy.model_detection sets for every SVD checkpoint (video_model branch)
        "extra_ff_mix_layer": True,
        "use_spatial_context": True,
        "merge_strategy": "learned_with_images",
        "merge_factor": 0.0,
        "video_kernel_size": [3, 1, 1],
        "disable_temporal_crossattention": False,
        "max_ddpm_temb_period": 10000,
        "num_head_channels": head_dims.pop(),  # SVD's is 64; the head size shapes no weight
        "image_size": 32,
        "use_checkpoint": False,
        "use_spatial_transformer": True,
        "legacy": False,
    }


def comfyui_svd_model(comfy, unet_config: dict):
    """ComfyUI's SVD model object at the tiny size, weights zero (a patched weight is then the delta)."""
    model_config = comfy.supported_models.SVD_img2vid(unet_config)
    model_config.unet_config["num_head_channels"] = unet_config["num_head_channels"]  # extra config sets 64
    model = model_config.get_model({}, device=torch.device("cpu"))
    with torch.no_grad():
        for tensor in model.diffusion_model.state_dict().values():
            tensor.zero_()
    detected = comfy.model_detection.detect_unet_config(model.diffusion_model.state_dict(), "")
    for key in ("num_res_blocks", "channel_mult", "transformer_depth", "transformer_depth_output"):
        assert list(detected[key]) == list(unet_config[key]), (key, detected[key], unet_config[key])
    assert detected["use_temporal_attention"] and detected["context_dim"] == unet_config["context_dim"]
    return model


def check_same_size(model, svd: Path) -> None:
    """ComfyUI's model and the tiny diffusers UNet hold the same tensors (count and sizes), so the config
    above is the tiny SVD's and not merely one ComfyUI accepts."""
    unet = UNetSpatioTemporalConditionModel.from_pretrained(svd, subfolder="unet")
    ours = sorted(tuple(t.shape) for t in unet.state_dict().values())
    theirs = sorted(tuple(t.shape) for t in model.diffusion_model.state_dict().values())
    assert ours == theirs, "ComfyUI's tiny SVD differs from the diffusers one"


def make_adapter(svd: Path, extra: dict, out: Path) -> tuple[dict, dict]:
    """peft's saved adapter on the tiny SVD UNet, as a run's final/ holds it."""
    unet = UNetSpatioTemporalConditionModel.from_pretrained(svd, subfolder="unet")
    lora = LoraConfig(
        lora_alpha=ALPHA,
        target_modules=ATTENTION_TARGETS + FEED_FORWARD_TARGETS + PROJECTION_TARGETS,
        init_lora_weights=False,
        **extra,
    )
    torch.manual_seed(0)
    get_peft_model(unet, lora).save_pretrained(out)
    config = json.loads((out / "adapter_config.json").read_text())
    config["target_modules"] = sorted(config["target_modules"])  # peft writes a set: any order
    return load_file(out / "adapter_model.safetensors"), config


def seeded_adapter(model: torch.nn.Module, lora: LoraConfig) -> dict[str, torch.Tensor]:
    """peft's adapter tensors (`get_peft_model_state_dict`) of `model` with seeded non-zero lora_B (the Wan
    and LTX-2 generators: a zero lora_B would make every delta zero, and a delta that is zero proves
    nothing)."""
    wrapped = get_peft_model(model, lora)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return {key: value.contiguous() for key, value in get_peft_model_state_dict(wrapped).items()}


class _Unloaded(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_comfyui(comfy, model, lora_file: Path) -> tuple[dict, list[str]]:
    """LoraLoaderModelOnly's path on our file: the weights it changed, and what it refused to load."""
    patcher = comfy.model_patcher.ModelPatcher(model, load_device="cpu", offload_device="cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lora = comfy.utils.load_torch_file(str(lora_file), safe_load=True)
    handler = _Unloaded()
    logging.getLogger().addHandler(handler)
    try:
        patched, _ = comfy.sd.load_lora_for_models(patcher, None, lora, 1.0, 0)
        patched.patch_model()
        after = {k: v.detach().clone() for k, v in patched.model.state_dict().items()}
        patched.unpatch_model()
    finally:
        logging.getLogger().removeHandler(handler)
    changed = {k: after[k].contiguous() for k in before if not torch.equal(before[k], after[k])}
    refused = [line for line in handler.lines if "not loaded" in line.lower()]
    return changed, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--comfyui", type=Path, required=True, help="ComfyUI checkout (see the docstring)")
    args = parser.parse_args()
    comfy = import_comfyui(args.comfyui.resolve())
    svd = create_tiny_svd(default_cache_dir() / "tiny_svd")
    diffusers_config = json.loads((svd / "unet" / "config.json").read_text())
    unet_config = tiny_unet_config(diffusers_config)
    model = comfyui_svd_model(comfy, unet_config)
    check_same_size(model, svd)
    key_map = comfy.lora.model_lora_keys_unet(model, {})
    record = {
        "upstream": UPSTREAM,
        "diffusers_unet_config": diffusers_config,
        "comfyui_unet_config": unet_config,
        "comfyui_model_weights": sorted(k for k in model.state_dict() if k.startswith("diffusion_model.")),
        "comfyui_key_map": dict(sorted(key_map.items())),
        "comfyui_unet_to_diffusers": dict(sorted(comfy.utils.unet_to_diffusers(unet_config).items())),
        "variants": {},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in VARIANTS.items():
            adapter, adapter_config = make_adapter(svd, extra, Path(tmp) / name)
            exported = comfyui_lora_state_dict(adapter, adapter_config, diffusers_config)
            lora_file = Path(tmp) / f"{name}.safetensors"
            save_file(exported, lora_file)
            changed, refused = run_comfyui(comfy, model, lora_file)
            save_file(adapter, OUT / f"adapter_{name}.safetensors")
            (OUT / f"adapter_config_{name}.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
            save_file(changed, OUT / f"deltas_{name}.safetensors")
            record["variants"][name] = {
                "exported_keys": sorted(exported),
                "not_loaded_log": refused,
                "changed_weights": sorted(changed),
            }
            print(f"{name}: {len(exported)} keys exported, {len(changed)} changed, {len(refused)} refused")
    (OUT / "keys.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
