"""Writes `tests/golden/wan_lora_keys/`: what ComfyUI's own LoRA loader does with our Wan ComfyUI export.

ComfyUI's code is run, not re-implemented: its Wan 2.1 image-to-video model (`comfy.supported_models.
WAN21_I2V` -> `comfy.model_base.WAN21`, whose network is `comfy.ldm.wan.model.WanModel`; first-last-frame
is the same class with `flf_pos_embed_token_number`, as `comfy.model_detection` sets it from
`img_emb.emb_pos`) is built at the tiny Wan transformer's size (wan/tiny.py), and our exported
file goes through the LoraLoaderModelOnly node's path (`comfy.lora.model_lora_keys_unet` builds the
accepted key map; `comfy.sd.load_lora_for_models`; `ModelPatcher.patch_model()`), reusing
make_comfyui_golden.py's `import_comfyui` / `run_comfyui`.

Upstream: the same ComfyUI checkout as make_comfyui_golden.py (fork pollockjj/ComfyUI at
618b803d314a525faca8f8163d85eaa9ebc1d774, merging comfyanonymous/ComfyUI 3cd7b32f; the fetch tool refuses
comfyanonymous/ComfyUI itself, over its size limit). Make it (Python files only) and run from the
repository root:

    G="git --git-dir=/work/.mirror/pollockjj+ComfyUI/repo"; C=618b803d314a525faca8f8163d85eaa9ebc1d774
    PY='^(comfy|comfy_api|comfy_extras|comfy_execution|comfy_config)/.*\\.py$|^[a-z_]+\\.py$'
    $G ls-tree -r --name-only $C | grep -E "$PY" \\
      | while read f; do mkdir -p /tmp/comfyui/$(dirname $f); $G show $C:$f > /tmp/comfyui/$f; done
    python scripts/dev/make_wan_lora_golden.py --comfyui /tmp/comfyui

Patches at run time, none to ComfyUI's files: the torchvision stub and `--cpu` of make_comfyui_golden.py;
ComfyUI's model weights are zeroed before patching, so a patched weight IS ComfyUI's delta. ComfyUI's
image projection is hard-wired to CLIP width 1280 (the tiny CLIP is 8 wide): it holds no LoRA target, and
every block weight's shape is checked against the diffusers tiny transformer's.

Stored per mode (i2v, flf2v): peft's adapter tensors on the tiny transformer (`adapter_<mode>.safetensors`:
WAN_LORA_TARGETS, r 4, alpha 6, seeded non-zero lora_B), ComfyUI's patched deltas (`deltas_<mode>.
safetensors`), and in `keys.json` ComfyUI's config, its LoRA key map for the model, our exported keys,
what ComfyUI changed and any "lora key not loaded" lines. Deterministic output.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from diffusers import WanTransformer3DModel
from peft import LoraConfig
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_comfyui_golden import UPSTREAM, import_comfyui, run_comfyui, seeded_adapter

from framer_ds.tasks.video_lora.wan.lora_layout import (
    COMFYUI_MODULES,
    WAN_LORA_TARGETS,
    to_comfyui_state_dict,
)
from framer_ds.tasks.video_lora.wan.tiny import IMAGE_TOKENS, TINY_WAN_TRANSFORMER

OUT = Path(__file__).resolve().parents[2] / "tests" / "golden" / "wan_lora_keys"
LORA = {"r": 4, "lora_alpha": 6.0}


def tiny_transformer(mode: str) -> WanTransformer3DModel:
    torch.manual_seed(0)
    pos = 2 * IMAGE_TOKENS if mode == "flf2v" else None
    return WanTransformer3DModel(**TINY_WAN_TRANSFORMER, pos_embed_seq_len=pos)


def comfyui_unet_config(mode: str) -> dict:
    """The tiny transformer in ComfyUI's WanModel terms (the keys comfy.model_detection fills for Wan 2.1,
    at tiny size; its num_heads = dim // 128 rule does not hold for a 16-wide model, so heads are given)."""
    cfg = TINY_WAN_TRANSFORMER
    config = {
        "image_model": "wan2.1",
        "model_type": "i2v",
        "dim": cfg["num_attention_heads"] * cfg["attention_head_dim"],
        "out_dim": cfg["out_channels"],
        "num_heads": cfg["num_attention_heads"],
        "ffn_dim": cfg["ffn_dim"],
        "num_layers": cfg["num_layers"],
        "patch_size": tuple(cfg["patch_size"]),
        "freq_dim": cfg["freq_dim"],
        "text_dim": cfg["text_dim"],
        "window_size": (-1, -1),
        "qk_norm": True,
        "cross_attn_norm": True,
        "eps": 1e-6,
        "in_dim": cfg["in_channels"],
    }
    if mode == "flf2v":
        config["flf_pos_embed_token_number"] = 2 * IMAGE_TOKENS
    return config


def comfyui_wan_model(comfy, unet_config: dict, diffusers_model: WanTransformer3DModel):
    """ComfyUI's Wan model at the tiny size, weights zero; each LoRA-target weight has the diffusers shape."""
    model = comfy.supported_models.WAN21_I2V(unet_config).get_model({}, device=torch.device("cpu"))
    with torch.no_grad():
        for tensor in model.diffusion_model.state_dict().values():
            tensor.zero_()
    theirs = model.diffusion_model.state_dict()
    ours = diffusers_model.state_dict()
    for block in range(unet_config["num_layers"]):
        for diffusers_name, original in COMFYUI_MODULES.items():
            shape = tuple(ours[f"blocks.{block}.{diffusers_name}.weight"].shape)
            assert tuple(theirs[f"blocks.{block}.{original}.weight"].shape) == shape, (block, original)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--comfyui", type=Path, required=True, help="ComfyUI checkout (see the docstring)")
    args = parser.parse_args()
    comfy = import_comfyui(args.comfyui.resolve())
    record: dict = {"upstream": UPSTREAM, "lora": LORA, "modes": {}}
    OUT.mkdir(parents=True, exist_ok=True)
    for mode in ("i2v", "flf2v"):
        unet_config = comfyui_unet_config(mode)
        transformer = tiny_transformer(mode)
        model = comfyui_wan_model(comfy, unet_config, transformer)
        key_map = comfy.lora.model_lora_keys_unet(model, {})
        adapter = seeded_adapter(transformer, LoraConfig(target_modules=list(WAN_LORA_TARGETS), **LORA))
        exported = to_comfyui_state_dict(adapter, LORA)
        with tempfile.TemporaryDirectory() as tmp:
            lora_file = Path(tmp) / "lora.safetensors"
            save_file(exported, lora_file)
            changed, refused = run_comfyui(comfy, model, lora_file)
        save_file(adapter, OUT / f"adapter_{mode}.safetensors")
        save_file(changed, OUT / f"deltas_{mode}.safetensors")
        record["modes"][mode] = {
            "comfyui_unet_config": unet_config,
            "comfyui_key_map": dict(sorted(key_map.items())),
            "exported_keys": sorted(exported),
            "changed_weights": sorted(changed),
            "not_loaded_log": refused,
        }
        print(
            f"{mode}: {len(exported)} keys exported, {len(changed)} weights changed, {len(refused)} refused"
        )
    (OUT / "keys.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
