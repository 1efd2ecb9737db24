"""LTX-2's `framer-ds export --format comfyui`: the file ComfyUI's own LoRA loader maps and applies (golden
from ComfyUI's code, scripts/dev/make_ltx2_lora_golden.py: every key loaded, the deltas peft's), written
beside the files already in --out; diffusers' LTX-2 loader reads the same file back to peft's deltas.

Tolerance of every delta comparison, from the arithmetic: both sides are float32 sums of r products (peft:
scale * (B @ A); ComfyUI and diffusers: 1 * (fl(scale * B) @ A), our file folding the scale into lora_B),
so an element differs by at most (r + 2) roundings of 2^-24 relative to sum_k |scale * B_ik * A_kj| (the
r - 1 additions of each sum, the scale's product and the rounding of fl(scale * B)); `_bound` is that,
per element (measured: at most 0.66 of it; a scale left out of lora_B is off by a third of the delta)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import umask, wrong_modes
from framer_ds.config.errors import ConfigError
from framer_ds.tasks.video_lora.ltx2.export import COMFYUI_LTX2_FILE, export_comfyui
from framer_ds.tasks.video_lora.ltx2.lora import comfyui_module, to_comfyui_state_dict
from framer_ds.tasks.video_lora.shared.comfyui_lora import lora_scale
from framer_ds.tasks.video_lora.shared.exports import EXPORT_METADATA, VideoExportCommandOptions

GOLDEN = Path(__file__).resolve().parents[3] / "golden" / "ltx2_lora_keys"
RECORD = json.loads((GOLDEN / "keys.json").read_text())
VARIANTS = ("video", "every_linear")
PEFT = "base_model.model."


def _adapter(variant: str) -> tuple[dict[str, torch.Tensor], dict]:
    config = json.loads((GOLDEN / f"adapter_config_{variant}.json").read_text())
    return load_file(GOLDEN / f"adapter_{variant}.safetensors"), config


def _final(tmp_path: Path, variant: str) -> Path:
    """A run's final/ holding the golden adapter (what `framer-ds export RUN/final` reads)."""
    tensors, config = _adapter(variant)
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    save_file(tensors, final / "adapter_model.safetensors")
    (final / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "LORA"}))
    record = {"base": "ltx2", "base_model": "/models/ltx2", "mode": "interpolation", "frame_rate": 24.0}
    (final / EXPORT_METADATA).write_text(json.dumps(record))
    return final


def _peft_deltas(variant: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{diffusers module: (peft's delta scale * B @ A, its rounding bound)} of the golden adapter."""
    tensors, config = _adapter(variant)
    deltas = {}
    for key, down in tensors.items():
        if key.endswith(".lora_A.weight"):
            up = tensors[key.replace("lora_A", "lora_B")]
            scale = lora_scale(down.shape[0], config)
            bound = (down.shape[0] + 2) * 2.0**-24 * (scale * up.abs()) @ down.abs()
            deltas[key.removeprefix(PEFT)[: -len(".lora_A.weight")]] = (scale * (up @ down), bound)
    return deltas


def _assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    assert actual.dtype == torch.float32 and actual.shape == expected.shape, what
    excess = (actual - expected).abs() - bound
    assert excess.max() <= 0, (what, excess.max().item())


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_export_is_what_comfyuis_loader_maps_and_applies_beside_the_users_files(
    tmp_path: Path, variant: str
) -> None:
    """Our export of the stored adapter into `ComfyUI/models/loras` (holding another LoRA and a note):
    the keys ComfyUI loaded from the golden's export (none refused), each in ComfyUI's key map of its
    LTX-2 model; ComfyUI's deltas are peft's, and ComfyUI's arithmetic (weight_adapter/lora.py: no
    `.alpha` -> scale 1, `lora_B @ lora_A`) on the file written now gives them; the user's files are
    untouched and the file is 0644 (before: `--format comfyui` was refused for LTX-2)."""
    golden = RECORD["variants"][variant]
    out = tmp_path / "ComfyUI" / "models" / "loras"
    out.mkdir(parents=True)
    (out / "other_lora.safetensors").write_bytes(b"someone else's weights")
    (out / "readme.txt").write_text("mine\n")
    others = {p.name: p.read_bytes() for p in out.iterdir()}
    with umask(0o022):
        line = export_comfyui(_final(tmp_path, variant), VideoExportCommandOptions(format="comfyui", out=out))
    assert str(out / COMFYUI_LTX2_FILE) in line and "LoraLoaderModelOnly" in line
    assert {name: (out / name).read_bytes() for name in others} == others
    assert sorted(p.name for p in out.iterdir()) == sorted([*others, COMFYUI_LTX2_FILE])
    assert wrong_modes(out / COMFYUI_LTX2_FILE, 0o022) == []
    with safe_open(str(out / COMFYUI_LTX2_FILE), "pt") as handle:
        assert json.loads(handle.metadata()[EXPORT_METADATA])["format"] == "comfyui"

    exported = load_file(out / COMFYUI_LTX2_FILE)
    assert sorted(exported) == golden["exported_keys"] and golden["not_loaded_log"] == []
    key_map = RECORD["comfyui_key_map"]
    for key in exported:
        prefix = key.rsplit(".", 2)[0]  # diffusion_model.<module>, without .lora_A.weight
        assert key_map.get(prefix) == f"{prefix}.weight", key
    patched = load_file(GOLDEN / f"deltas_{variant}.safetensors")
    expected = _peft_deltas(variant)
    assert len(patched) == len(expected) == len(exported) // 2 == len(golden["changed_weights"])
    for module, (delta, bound) in expected.items():
        name = f"diffusion_model.{RECORD['comfyui_module_names'][module]}"
        _assert_within(patched[f"{name}.weight"], delta, bound, module)
        ours = exported[f"{name}.lora_B.weight"] @ exported[f"{name}.lora_A.weight"]  # ComfyUI: alpha 1.0
        _assert_within(ours, patched[f"{name}.weight"], 2 * bound, module)


def test_every_linear_layer_has_the_name_comfyuis_model_gives_it() -> None:
    """ComfyUI's LTX-2 model holds, under `comfyui_module`'s name, a weight of each diffusers linear
    layer's shape (checked by the generator on ComfyUI's model); the map here still gives those names."""
    names = RECORD["comfyui_module_names"]
    assert len(names) == 82 and names["proj_in"] == "patchify_proj"
    assert {module: comfyui_module(module) for module in names} == names


@pytest.mark.parametrize("variant", VARIANTS)
def test_diffusers_reads_the_comfyui_file_back_to_peft_deltas(tmp_path: Path, variant: str) -> None:
    """diffusers' LTX-2 loader (`_convert_non_diffusers_ltx2_lora_to_diffusers` for `diffusion_model.`
    keys; no `.alpha`, so lora_alpha = rank, scale 1) gives peft's delta on every targeted module."""
    from diffusers import LTX2ImageToVideoPipeline, LTX2VideoTransformer3DModel

    from framer_ds.tasks.video_lora.ltx2.tiny import TINY_LTX2_TRANSFORMER

    tensors, config = _adapter(variant)
    save_file(to_comfyui_state_dict(tensors, config), tmp_path / "lora.safetensors")
    state_dict = LTX2ImageToVideoPipeline.lora_state_dict(tmp_path / "lora.safetensors")
    transformer = LTX2VideoTransformer3DModel(**TINY_LTX2_TRANSFORMER)
    transformer.load_lora_adapter(state_dict, prefix="transformer", adapter_name="ours")
    loaded = {
        name: module.get_delta_weight("ours")
        for name, module in transformer.named_modules()
        if hasattr(module, "get_delta_weight") and "ours" in getattr(module, "lora_A", {})
    }
    expected = _peft_deltas(variant)
    assert set(loaded) == set(expected)
    for module, (delta, bound) in expected.items():
        _assert_within(loaded[module], delta, bound, module)


def test_dtype_base_and_adapters_a_lora_file_cannot_carry(tmp_path: Path) -> None:
    """--dtype bfloat16 writes the float32 export rounded to bfloat16; --base (read by no LTX-2 comfyui
    export) is refused in one line; a DoRA adapter, a fully trained module and a module with no known
    ComfyUI name are refused by name, and nothing is written."""
    final = _final(tmp_path, "video")
    options = {"format": "comfyui", "out": tmp_path / "out"}
    export_comfyui(final, VideoExportCommandOptions(**options))
    full = load_file(tmp_path / "out" / COMFYUI_LTX2_FILE)
    export_comfyui(final, VideoExportCommandOptions(**options, dtype="bfloat16", overwrite=True))
    half = load_file(tmp_path / "out" / COMFYUI_LTX2_FILE)
    assert {key: value.dtype for key, value in half.items()} == dict.fromkeys(full, torch.bfloat16)
    assert all(torch.equal(half[key], full[key].to(torch.bfloat16)) for key in full)

    with pytest.raises(ConfigError, match="--base: an LTX-2 comfyui export reads no base model"):
        export_comfyui(final, VideoExportCommandOptions(**options, base=tmp_path, overwrite=True))
    config = json.loads((final / "adapter_config.json").read_text())
    (final / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ConfigError, match="comfyui cannot load this adapter: it is a DoRA adapter"):
        export_comfyui(final, VideoExportCommandOptions(format="comfyui", out=tmp_path / "dora"))
    assert not (tmp_path / "dora").exists()
    trained = {f"{PEFT}proj_in.weight": torch.ones(16, 4)}
    with pytest.raises(ConfigError, match=r"proj_in\.weight is not a LoRA matrix"):
        to_comfyui_state_dict(trained)
    unknown = {f"{PEFT}connectors.linear.lora_{x}.weight": torch.ones(2, 2) for x in "AB"}
    with pytest.raises(ConfigError, match=r"connectors\.linear is not a module of LTX-2's transformer"):
        to_comfyui_state_dict(unknown)
