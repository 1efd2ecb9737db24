"""Wan LoRA layouts: the ComfyUI export is one ComfyUI's own loader maps and applies (golden from ComfyUI's
code, scripts/dev/make_wan_lora_golden.py), and diffusers' `load_lora_weights` reads both of our files
(the diffusers layout directly, the ComfyUI layout through its non-diffusers Wan converter) into the same
weights as peft's adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from diffusers import WanImageToVideoPipeline
from safetensors.torch import load_file, save_file

from framer_ds.tasks.video_lora.shared.comfyui_lora import lora_scale
from framer_ds.tasks.video_lora.wan.lora_layout import (
    COMFYUI_MODULES,
    WAN_LORA_TARGETS,
    to_comfyui_state_dict,
    to_diffusers_state_dict,
)

GOLDEN = Path(__file__).resolve().parents[3] / "golden" / "wan_lora_keys"
RECORD = json.loads((GOLDEN / "keys.json").read_text())
MODES = ("i2v", "flf2v")
SUFFIXES = (".lora_down.weight", ".lora_up.weight", ".alpha")


def _adapter(mode: str) -> dict[str, torch.Tensor]:
    return load_file(GOLDEN / f"adapter_{mode}.safetensors")


def _peft_deltas(adapter: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """{diffusers module: scale * B @ A}, what peft adds to each weight."""
    deltas = {}
    for key, down in adapter.items():
        if key.endswith(".lora_A.weight"):
            module = key.removeprefix("base_model.model.")[: -len(".lora_A.weight")]
            deltas[module] = scale * adapter[key.replace("lora_A", "lora_B")] @ down
    return deltas


@pytest.mark.parametrize("mode", MODES)
def test_every_exported_key_is_one_comfyui_maps_and_applies(mode: str) -> None:
    """Our export of the stored adapter: the keys ComfyUI loaded (none refused), each LoRA prefix in
    ComfyUI's key map, and ComfyUI's patched deltas = peft's scale * B @ A on the original Wan names.
    Tolerance 1e-6: ComfyUI computes alpha / rank * up @ down in float32 as peft does (values ~1e-1)."""
    golden = RECORD["modes"][mode]
    exported = to_comfyui_state_dict(_adapter(mode), RECORD["lora"])
    assert sorted(exported) == golden["exported_keys"] and golden["not_loaded_log"] == []
    key_map = golden["comfyui_key_map"]
    for key in exported:
        prefix = next(key[: -len(s)] for s in SUFFIXES if key.endswith(s))
        assert key_map.get(prefix) == f"{prefix}.weight", key
    deltas = load_file(GOLDEN / f"deltas_{mode}.safetensors")
    expected = _peft_deltas(_adapter(mode), lora_scale(4, RECORD["lora"]))
    assert len(deltas) == len(expected) == 2 * len(WAN_LORA_TARGETS)
    for module, delta in expected.items():
        _, block, relative = module.split(".", 2)
        patched = deltas[f"diffusion_model.blocks.{block}.{COMFYUI_MODULES[relative]}.weight"]
        torch.testing.assert_close(patched, delta, rtol=0, atol=1e-6)


def _loaded_deltas(folder: Path, state_dict: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """The weight deltas diffusers' pipeline holds after `load_lora_weights` of this file."""
    save_file(state_dict, path)
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    pipe.load_lora_weights(path.parent, weight_name=path.name, adapter_name="ours")
    return {
        name: module.get_delta_weight("ours")
        for name, module in pipe.transformer.named_modules()
        if hasattr(module, "get_delta_weight") and "ours" in getattr(module, "lora_A", {})
    }


@pytest.mark.parametrize("mode", MODES)
def test_diffusers_loads_both_layouts_as_peft_has_them(
    tiny_wan_bases: dict[str, Path], tmp_path: Path, mode: str
) -> None:
    """diffusers' load_lora_weights on our diffusers file and on our ComfyUI file (its
    `_convert_non_diffusers_wan_lora_to_diffusers`, alpha split into the two matrices) gives peft's
    deltas on every targeted module. Tolerance 1e-6: products of the same float32 matrices, only the
    placement of the alpha / rank factor differs."""
    adapter = _adapter(mode)
    expected = _peft_deltas(adapter, lora_scale(4, RECORD["lora"]))
    folder = tiny_wan_bases[mode]
    direct = _loaded_deltas(
        folder, to_diffusers_state_dict(adapter, RECORD["lora"]), tmp_path / "d.safetensors"
    )
    comfy = _loaded_deltas(folder, to_comfyui_state_dict(adapter, RECORD["lora"]), tmp_path / "c.safetensors")
    assert set(direct) == set(comfy) == set(expected)
    for module, delta in expected.items():
        torch.testing.assert_close(direct[module], delta, rtol=0, atol=1e-6)
        torch.testing.assert_close(comfy[module], delta, rtol=0, atol=1e-6)


def test_scale_and_refusals() -> None:
    assert lora_scale(4, {"lora_alpha": 8}) == 2.0
    assert lora_scale(16, {"lora_alpha": 8, "use_rslora": True}) == 2.0
    assert lora_scale(4, None) == 1.0
    pair = {
        "blocks.0.attn1.to_q.lora_A.weight": torch.ones(2, 4),
        "blocks.0.attn1.to_q.lora_B.weight": torch.ones(4, 2),
    }
    assert set(to_diffusers_state_dict(pair)) == {"transformer." + key for key in pair}
    assert to_comfyui_state_dict(pair)["diffusion_model.blocks.0.self_attn.q.alpha"].item() == 2.0  # scale 1
    outside = {"condition_embedder.time_proj.lora_A.weight": torch.ones(2, 4)}
    with pytest.raises(ValueError, match="not a LoRA matrix of a Wan block's linear layer"):
        to_comfyui_state_dict(outside)
    with pytest.raises(ValueError, match="has lora_A only"):
        to_diffusers_state_dict({"blocks.0.attn1.to_q.lora_A.weight": torch.ones(2, 4)})
