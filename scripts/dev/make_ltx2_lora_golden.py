"""Writes `tests/golden/ltx2_lora_keys/`: what ComfyUI's own LoRA loader does with our LTX-2 ComfyUI export.

ComfyUI's code is run, not re-implemented: its LTX-2 model (`comfy.supported_models.LTXAV` ->
`comfy.model_base.LTXAV`, whose network is `comfy.ldm.lightricks.av_model.LTXAVModel`, the audio-video
transformer that `comfy.model_detection` picks for an LTX-2 checkpoint: `audio_adaln_single` present) is
built at the tiny LTX-2 transformer's size (ltx2/tiny.py), and our exported file goes through the
LoraLoaderModelOnly node's path (`comfy.lora.model_lora_keys_unet` builds the accepted key map: for LTX-2
its generic `diffusion_model.<weight>` entries, it has no LTX-specific ones; `comfy.sd.
load_lora_for_models`; `ModelPatcher.patch_model()`), reusing make_comfyui_golden.py's `import_comfyui`
/ `run_comfyui`.

Upstream: the same ComfyUI checkout as make_comfyui_golden.py and make_wan_lora_golden.py (fork
pollockjj/ComfyUI at 618b803d314a525faca8f8163d85eaa9ebc1d774, merging comfyanonymous/ComfyUI 3cd7b32f,
2026-01-07, which has LTX-2: `comfy/ldm/lightricks/av_model.py`). Make it (Python files only) and run
from the repository root:

    G="git --git-dir=/work/.mirror/pollockjj+ComfyUI/repo"; C=618b803d314a525faca8f8163d85eaa9ebc1d774
    PY='^(comfy|comfy_api|comfy_extras|comfy_execution|comfy_config)/.*\\.py$|^[a-z_]+\\.py$'
    $G ls-tree -r --name-only $C | grep -E "$PY" \\
      | while read f; do mkdir -p /tmp/comfyui/$(dirname $f); $G show $C:$f > /tmp/comfyui/$f; done
    python scripts/dev/make_ltx2_lora_golden.py --comfyui /tmp/comfyui

Patches at run time, none to ComfyUI's files: the torchvision stub and `--cpu` of make_comfyui_golden.py;
ComfyUI's model weights are zeroed before patching, so a patched weight IS ComfyUI's delta. Every linear
layer of the diffusers tiny transformer is checked to have, under its ComfyUI name (ltx2/lora.py
`comfyui_module`), a weight of the same shape in ComfyUI's model; the pairs are stored.

Stored per variant ("video": LTX2_LORA_TARGETS, what training targets by default, r 4, alpha 6;
"every_linear": every linear layer of the transformer, audio and top-level ones included, r 8, alpha 11,
rsLoRA): peft's adapter tensors on the tiny transformer (`adapter_<v>.safetensors`, seeded non-zero
lora_B) and its config (`adapter_config_<v>.json`), ComfyUI's patched deltas (`deltas_<v>.safetensors`),
and in `keys.json` ComfyUI's config, its LoRA key map for the model, the module names, our exported keys,
what ComfyUI changed and any "lora key not loaded" lines. Deterministic output.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from diffusers import LTX2VideoTransformer3DModel
from peft import LoraConfig
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_comfyui_golden import UPSTREAM, import_comfyui, run_comfyui, seeded_adapter

from framer_ds.tasks.video_lora.ltx2.lora import LTX2_LORA_TARGETS, comfyui_module, to_comfyui_state_dict
from framer_ds.tasks.video_lora.ltx2.tiny import TINY_LTX2_TRANSFORMER

OUT = Path(__file__).resolve().parents[2] / "tests" / "golden" / "ltx2_lora_keys"


def tiny_transformer() -> LTX2VideoTransformer3DModel:
    torch.manual_seed(0)
    return LTX2VideoTransformer3DModel(**TINY_LTX2_TRANSFORMER)


def linear_modules(model: torch.nn.Module) -> list[str]:
    return sorted(name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear))


def variants(transformer: LTX2VideoTransformer3DModel) -> dict[str, dict]:
    """peft LoraConfig arguments per variant (module docstring)."""
    return {
        "video": {"target_modules": sorted(LTX2_LORA_TARGETS), "r": 4, "lora_alpha": 6.0},
        "every_linear": {
            "target_modules": linear_modules(transformer),
            "r": 8,
            "lora_alpha": 11.0,
            "use_rslora": True,
        },
    }


def comfyui_unet_config() -> dict:
    """The tiny transformer in ComfyUI's LTXAVModel terms (its constructor's arguments, at tiny size)."""
    cfg = TINY_LTX2_TRANSFORMER
    return {
        "image_model": "ltxav",
        "in_channels": cfg["in_channels"],
        "audio_in_channels": cfg["audio_in_channels"],
        "cross_attention_dim": cfg["cross_attention_dim"],
        "audio_cross_attention_dim": cfg["audio_cross_attention_dim"],
        "attention_head_dim": cfg["attention_head_dim"],
        "audio_attention_head_dim": cfg["audio_attention_head_dim"],
        "num_attention_heads": cfg["num_attention_heads"],
        "audio_num_attention_heads": cfg["audio_num_attention_heads"],
        "caption_channels": cfg["caption_channels"],
        "num_layers": cfg["num_layers"],
    }


def comfyui_ltx2_model(comfy, unet_config: dict, diffusers_model: LTX2VideoTransformer3DModel):
    """ComfyUI's LTX-2 model at the tiny size, weights zero, and {diffusers linear: ComfyUI name}, each
    ComfyUI weight of the diffusers shape."""
    model = comfy.supported_models.LTXAV(unet_config).get_model({}, device=torch.device("cpu"))
    with torch.no_grad():
        for tensor in model.diffusion_model.state_dict().values():
            tensor.zero_()
    theirs = model.diffusion_model.state_dict()
    ours = diffusers_model.state_dict()
    names = {}
    for name in linear_modules(diffusers_model):
        original = comfyui_module(name)
        shape = tuple(ours[f"{name}.weight"].shape)
        assert tuple(theirs[f"{original}.weight"].shape) == shape, (name, original)
        names[name] = original
    return model, names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--comfyui", type=Path, required=True, help="ComfyUI checkout (see the docstring)")
    args = parser.parse_args()
    comfy = import_comfyui(args.comfyui.resolve())
    unet_config = comfyui_unet_config()
    model, names = comfyui_ltx2_model(comfy, unet_config, tiny_transformer())
    key_map = comfy.lora.model_lora_keys_unet(model, {})
    record: dict = {
        "upstream": UPSTREAM,
        "comfyui_unet_config": unet_config,
        "comfyui_module_names": names,
        "comfyui_key_map": dict(sorted(key_map.items())),
        "variants": {},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    for variant, lora in variants(tiny_transformer()).items():
        adapter = seeded_adapter(tiny_transformer(), LoraConfig(**lora))
        exported = to_comfyui_state_dict(adapter, lora)
        model, _ = comfyui_ltx2_model(comfy, unet_config, tiny_transformer())  # zero weights again
        with tempfile.TemporaryDirectory() as tmp:
            lora_file = Path(tmp) / "lora.safetensors"
            save_file(exported, lora_file)
            changed, refused = run_comfyui(comfy, model, lora_file)
        save_file(adapter, OUT / f"adapter_{variant}.safetensors")
        (OUT / f"adapter_config_{variant}.json").write_text(json.dumps(lora, indent=1) + "\n")
        save_file(changed, OUT / f"deltas_{variant}.safetensors")
        record["variants"][variant] = {
            "exported_keys": sorted(exported),
            "changed_weights": sorted(changed),
            "not_loaded_log": refused,
        }
        print(f"{variant}: {len(exported)} keys exported, {len(changed)} changed, {len(refused)} refused")
    (OUT / "keys.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
