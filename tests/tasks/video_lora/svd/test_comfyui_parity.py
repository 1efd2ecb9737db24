"""`export --format comfyui` against ComfyUI's own LoRA loader (golden data: tests/golden/comfyui/, made by
scripts/dev/make_comfyui_golden.py, which runs ComfyUI's code on our export of a tiny SVD LoRA).

What ComfyUI does with the file (comfy/lora.py): `model_lora_keys_unet` accepts, for every weight
`diffusion_model.<path>.weight` of its SVD model, the generic key `diffusion_model.<path>`; `load_lora`
takes `<key>.lora_up.weight`, `<key>.lora_down.weight` and `<key>.alpha` and logs "lora key not
loaded" for anything else; the patch adds `alpha / rank * up @ down` (rank = lora_down's rows) to the
weight. peft's delta for the same module is `scaling * B @ A`, scaling = alpha / r (alpha / sqrt(r) with
rsLoRA). The export must make the two the same weight change on the same weight.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from peft import LoraConfig
from peft.tuners.lora.layer import Linear as LoraLinear
from safetensors.torch import load_file

from conftest import REPO
from framer_ds.tasks.video_lora.svd.comfyui_keys import (
    PEFT_PREFIX,
    comfyui_lora_state_dict,
    original_svd_module,
)

GOLDEN = REPO / "tests" / "golden" / "comfyui"
VARIANTS = ("plain", "rslora")
FP32_EPS = torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads((GOLDEN / "keys.json").read_text())


def adapter(variant: str) -> tuple[dict[str, torch.Tensor], dict]:
    config = json.loads((GOLDEN / f"adapter_config_{variant}.json").read_text())
    return load_file(GOLDEN / f"adapter_{variant}.safetensors"), config


def peft_modules(tensors: dict[str, torch.Tensor]) -> list[str]:
    return sorted(
        k[len(PEFT_PREFIX) : -len(".lora_A.weight")] for k in tensors if k.endswith(".lora_A.weight")
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_comfyui_loads_every_key_we_export_and_nothing_is_left_out(golden, variant):
    """Our export of the stored peft adapter is, key for key, the file ComfyUI was run on; ComfyUI loaded
    every key of it (no "lora key not loaded"), each module name is in ComfyUI's key map for its own
    SVD weight, and the weights ComfyUI changed are exactly those modules' weights."""
    tensors, config = adapter(variant)
    ours = comfyui_lora_state_dict(tensors, config, golden["diffusers_unet_config"])
    record = golden["variants"][variant]
    assert sorted(ours) == record["exported_keys"]
    assert record["not_loaded_log"] == []
    key_map, weights = golden["comfyui_key_map"], set(golden["comfyui_model_weights"])
    modules = sorted({k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in ours})
    for module in modules:
        assert key_map[module] == f"{module}.weight" and f"{module}.weight" in weights
        assert {f"{module}.lora_up.weight", f"{module}.lora_down.weight", f"{module}.alpha"} <= set(ours)
    assert len(ours) == 3 * len(modules)
    assert record["changed_weights"] == [f"{m}.weight" for m in modules]
    assert len(modules) == len(peft_modules(tensors))  # every peft module exported, one key set each


def test_our_module_map_agrees_with_comfyuis_own_diffusers_map(golden):
    """ComfyUI's `comfy.utils.unet_to_diffusers` names the spatial transformer weights (not the temporal
    ones) in both layouts; where it does, our diffusers -> original map says the same."""
    theirs = golden["comfyui_unet_to_diffusers"]
    lpb = golden["diffusers_unet_config"]["layers_per_block"]
    checked = 0
    for module in peft_modules(adapter("plain")[0]):
        if f"{module}.weight" in theirs:
            assert original_svd_module(module, lpb) + ".weight" == theirs[f"{module}.weight"]
            checked += 1
    assert checked >= 20  # the spatial blocks' attention, feed-forward and projections


def peft_delta(a: torch.Tensor, b: torch.Tensor, config: dict) -> tuple[torch.Tensor, float]:
    """peft's own delta for one module (`LoraLayer.get_delta_weight`) and its scaling."""
    rank = a.shape[0]
    lora = LoraConfig(r=rank, lora_alpha=config["lora_alpha"], use_rslora=config["use_rslora"])
    layer = LoraLinear(
        torch.nn.Linear(a.shape[1], b.shape[0], bias=False),
        "default",
        lora,
        r=rank,
        lora_alpha=config["lora_alpha"],
        use_rslora=config["use_rslora"],
    )
    layer.lora_A["default"].weight.data.copy_(a)
    layer.lora_B["default"].weight.data.copy_(b)
    with torch.no_grad():
        return layer.get_delta_weight("default"), layer.scaling["default"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_comfyuis_weight_change_is_pefts(golden, variant):
    """ComfyUI's patched weights (the base was zero, so they are its deltas) equal peft's delta on the
    module our map names, and ComfyUI's alpha / rank is peft's scaling.

    Tolerance from the arithmetic: both sides compute the same fp32 product B @ A (rank-r sums) and scale
    it once; they differ only in the order of that scaling and in the scale itself, which our file carries
    as a float32 alpha (= scaling * r, rounded: relative error <= eps/2, then / r in double). So per
    element |ComfyUI - peft| <= 2 eps * scale * (|B| @ |A|) (one rounding of each scale, one of each
    product), far under any rank-r accumulation error the two share."""
    tensors, config = adapter(variant)
    deltas = load_file(GOLDEN / f"deltas_{variant}.safetensors")
    lpb = golden["diffusers_unet_config"]["layers_per_block"]
    ours = comfyui_lora_state_dict(tensors, config, golden["diffusers_unet_config"])
    worst = 0.0
    for module in peft_modules(tensors):
        a, b = (
            tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"],
            tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"],
        )
        expected, scaling = peft_delta(a, b, config)
        key = f"diffusion_model.{original_svd_module(module, lpb)}"
        comfy_scale = ours[f"{key}.alpha"].item() / ours[f"{key}.lora_down.weight"].shape[0]
        assert comfy_scale == pytest.approx(scaling, rel=FP32_EPS)
        bound = 2 * FP32_EPS * scaling * (b.abs() @ a.abs())
        difference = (deltas[f"{key}.weight"] - expected).abs()
        assert bool((difference <= bound).all()), module
        worst = max(worst, float(difference.max()))
    rank = int(config["r"])
    expected_scale = config["lora_alpha"] / (math.sqrt(rank) if config["use_rslora"] else rank)
    assert scaling == pytest.approx(expected_scale)
    print(f"{variant}: max |ComfyUI - peft| = {worst:.3g}")
