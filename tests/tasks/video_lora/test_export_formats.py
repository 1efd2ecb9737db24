"""`framer-ds export RUN/final --format peft|merged|comfyui`: each loader gets the adapter training made.

The adapter is made directly with peft on the tiny SVD UNet (random lora_B, so the delta is non-zero,
and alpha != rank), with the export record a run writes, so the command runs without a training run.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from diffusers import UNetSpatioTemporalConditionModel
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import umask, wrong_modes
from framer_ds.cli.main import main
from framer_ds.tasks.video_lora.comfyui_keys import original_svd_module
from framer_ds.tasks.video_lora.config import ATTENTION_TARGETS, FEED_FORWARD_TARGETS, PROJECTION_TARGETS
from framer_ds.tasks.video_lora.export_formats import COMFYUI_FILE
from framer_ds.tasks.video_lora.inference import EXPORT_METADATA
from framer_ds.tasks.video_lora.unet_lora import widen_conv_in
from video_adapters import ALPHA, RANK, make_adapter


def diffusers_module_of(original: str, layers_per_block: int) -> str:
    """Original SVD module -> diffusers, with diffusers' scripts/convert_svd_to_diffusers.py formulas
    (written apart from the exporter's map, so the round trip checks one against the other)."""
    per_block = layers_per_block + 1
    original = original.replace("time_stack.", "temporal_transformer_blocks.")
    if match := re.match(r"^input_blocks\.(\d+)\.1\.(.+)$", original):
        i = int(match[1])
        return f"down_blocks.{(i - 1) // per_block}.attentions.{(i - 1) % per_block}.{match[2]}"
    if match := re.match(r"^output_blocks\.(\d+)\.1\.(.+)$", original):
        i = int(match[1])
        return f"up_blocks.{i // per_block}.attentions.{i % per_block}.{match[2]}"
    match = re.match(r"^middle_block\.1\.(.+)$", original)
    assert match, original
    return f"mid_block.attentions.0.{match[1]}"


def test_comfyui_keys_map_back_to_the_merged_weights_exactly(tmp_path, capsys):
    adapter_dir, svd = make_adapter(tmp_path)
    out = tmp_path / "comfy"
    assert main(["export", str(adapter_dir), "--format", "comfyui", "--out", str(out)]) == 0
    assert "LoraLoaderModelOnly" in capsys.readouterr().out
    lora = load_file(out / COMFYUI_FILE)
    assert all(k.startswith("diffusion_model.") for k in lora)
    assert not any("base_model" in k or ".default" in k or "lora_A" in k or "lora_B" in k for k in lora)
    assert any(".time_stack." in k for k in lora) and not any("temporal_transformer" in k for k in lora)

    base = UNetSpatioTemporalConditionModel.from_pretrained(svd, subfolder="unet").state_dict()
    merged = (
        PeftModel.from_pretrained(
            UNetSpatioTemporalConditionModel.from_pretrained(svd, subfolder="unet"), adapter_dir
        )
        .merge_and_unload()
        .state_dict()
    )
    modules = sorted({k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in lora})
    lpb = json.loads((svd / "unet" / "config.json").read_text())["layers_per_block"]
    covered = set()
    for module in modules:
        up, down = lora[f"{module}.lora_up.weight"], lora[f"{module}.lora_down.weight"]
        alpha = lora[f"{module}.alpha"].item()
        assert alpha == ALPHA and down.shape[0] == RANK  # alpha stored, and != rank
        name = diffusers_module_of(module[len("diffusion_model.") :], lpb) + ".weight"
        delta = alpha / down.shape[0] * (up @ down)  # what ComfyUI's LoRA loader adds
        torch.testing.assert_close(base[name] + delta, merged[name], rtol=0, atol=1e-6)
        covered.add(name)
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed == covered  # every merged change has its ComfyUI key, and nothing else


def test_comfyui_map_follows_the_original_svd_layout():
    """On SVD's own UNet config (built on the meta device): attention lives in input_blocks 1,2,4,5,7,8,
    middle_block.1 and output_blocks 3..11 of Stability's VideoUNet, and no two modules share a key."""
    with torch.device("meta"):
        unet = UNetSpatioTemporalConditionModel()  # the defaults are stable-video-diffusion-img2vid's
    suffixes = tuple(ATTENTION_TARGETS + FEED_FORWARD_TARGETS + PROJECTION_TARGETS)
    names = [n for n, m in unet.named_modules() if isinstance(m, torch.nn.Linear) and n.endswith(suffixes)]
    mapped = [original_svd_module(n, unet.config.layers_per_block) for n in names]
    assert len(set(mapped)) == len(names)
    blocks = {tuple(m.split(".")[:2]) for m in mapped}
    expected = {("input_blocks", str(i)) for i in (1, 2, 4, 5, 7, 8)}
    expected |= {("output_blocks", str(i)) for i in range(3, 12)} | {("middle_block", "1")}
    assert blocks == expected
    assert "input_blocks.1.1.time_stack.0.attn1.to_q" in mapped
    assert "output_blocks.11.1.time_stack.0.ff_in.net.2" in mapped
    assert "middle_block.1.transformer_blocks.0.attn2.to_k" in mapped
    assert "input_blocks.8.1.proj_in" in mapped


def test_comfyui_refuses_an_interpolation_adapter_with_the_reason(tmp_path, capsys):
    adapter_dir, _ = make_adapter(tmp_path, "interpolation")
    out = tmp_path / "comfy"
    assert main(["export", str(adapter_dir), "--format", "comfyui", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "interpolation" in err and "9 input channels" in err and "--format merged" in err
    assert not out.exists()


def test_peft_and_merged_formats_load_with_their_libraries(tmp_path):
    adapter_dir, svd = make_adapter(tmp_path, "interpolation")
    peft_out, merged_out = tmp_path / "peft", tmp_path / "merged"
    assert main(["export", str(adapter_dir), "--format", "peft", "--out", str(peft_out)]) == 0
    merged_args = ["export", str(adapter_dir), "--format", "merged", "--out", str(merged_out)]
    assert main(merged_args) == 0
    assert main(merged_args) == 1  # never overwrites

    unet = widen_conv_in(UNetSpatioTemporalConditionModel.from_pretrained(svd, subfolder="unet"))
    expected = PeftModel.from_pretrained(unet, peft_out).merge_and_unload().state_dict()
    loaded = UNetSpatioTemporalConditionModel.from_pretrained(merged_out)
    assert loaded.config.in_channels == 9
    for name, weight in expected.items():
        torch.testing.assert_close(loaded.state_dict()[name], weight)
    assert json.loads((peft_out / EXPORT_METADATA).read_text())["mode"] == "interpolation"


@pytest.mark.parametrize("args", [[], ["--format", "onnx"]])
def test_export_without_a_known_format_names_the_choices(tmp_path, capsys, args):
    adapter_dir, _ = make_adapter(tmp_path)
    with pytest.raises(SystemExit):
        main(["export", str(adapter_dir), *args, "--out", str(tmp_path / "x")])
    assert "--format" in capsys.readouterr().err


def test_damaged_adapter_metadata_is_named_with_the_fix(tmp_path, capsys):
    adapter_dir, _ = make_adapter(tmp_path, "interpolation")
    metadata = adapter_dir / EXPORT_METADATA
    metadata.write_text(metadata.read_text()[:15])  # cut short by a copy
    assert main(["export", str(adapter_dir), "--format", "peft", "--out", str(tmp_path / "peft")]) == 1
    err = capsys.readouterr().err
    assert f"{metadata}: not valid JSON" in err and "re-export the run" in err
    assert not (tmp_path / "peft").exists()


# --- --out: an export never deletes or replaces a file it did not write (issue 45 §5) -------------------


def folder_with_other_files(folder):
    """A loader's folder as a user has it: another LoRA and a note, which every export must leave alone."""
    folder.mkdir(parents=True)
    (folder / "other_lora.safetensors").write_bytes(b"someone else's weights")
    (folder / "readme.txt").write_text("mine\n")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def unchanged(folder, before) -> bool:
    return {name: (folder / name).read_bytes() for name in before} == before


def test_comfyui_adds_its_file_beside_the_others_and_replaces_it_only_with_overwrite(tmp_path, capsys):
    """ComfyUI's models/loras holds every LoRA a user has: the export adds its one file there (before:
    refused as 'not empty'; the Wan path deleted the others). A file of the same name is replaced only
    with --overwrite, and then only that file; everything is readable under umask 022 (before: 0600)."""
    adapter_dir, _ = make_adapter(tmp_path)
    out = tmp_path / "ComfyUI" / "models" / "loras"
    before = folder_with_other_files(out)
    args = ["export", str(adapter_dir), "--format", "comfyui", "--out", str(out)]
    with umask(0o022):
        assert main(args) == 0, capsys.readouterr().err
    assert unchanged(out, before)
    assert sorted(p.name for p in out.iterdir()) == sorted([*before, COMFYUI_FILE])  # no staging left
    assert wrong_modes(out / COMFYUI_FILE, 0o022) == []
    header = safe_open(str(out / COMFYUI_FILE), "pt").metadata()
    assert json.loads(header[EXPORT_METADATA])["format"] == "comfyui"  # what made it, inside the file
    exported = {k: v.clone() for k, v in load_file(out / COMFYUI_FILE).items()}  # not the mmap of a file
    capsys.readouterr()

    (out / COMFYUI_FILE).write_bytes(b"a file of the same name")
    assert main(args) == 1  # refused without --overwrite, in one line naming the flag
    err = capsys.readouterr().err
    assert "exists; pass --overwrite" in err and "Traceback" not in err
    assert (out / COMFYUI_FILE).read_bytes() == b"a file of the same name" and unchanged(out, before)
    assert main([*args, "--overwrite"]) == 0
    replaced = load_file(out / COMFYUI_FILE)  # the bytes differ: safetensors orders its header by hash
    assert replaced.keys() == exported.keys() and all(torch.equal(replaced[k], exported[k]) for k in replaced)
    assert unchanged(out, before)
    assert sorted(p.name for p in out.iterdir()) == sorted([*before, COMFYUI_FILE])


@pytest.mark.parametrize(
    ("fmt", "mode"),
    [("peft", "image_to_video"), ("merged", "image_to_video"), ("merged", "interpolation")],
)
def test_a_directory_format_refuses_a_folder_that_holds_files_and_writes_a_new_one(
    tmp_path, capsys, fmt, mode
):
    """peft and merged write the directory a loader reads (from_pretrained(DIR)): a non-empty --out is
    refused in one line and stays as it was, --overwrite is refused too (it would delete files the
    export did not write); an empty --out is filled, readable by everyone under umask 022."""
    adapter_dir, _ = make_adapter(tmp_path, mode)
    taken = tmp_path / "taken"
    before = folder_with_other_files(taken)
    for extra in ([], ["--overwrite"]):
        assert main(["export", str(adapter_dir), "--format", fmt, "--out", str(taken), *extra]) == 1
        err = capsys.readouterr().err
        assert ("--overwrite:" if extra else "is not empty") in err and "Traceback" not in err
        assert sorted(p.name for p in taken.iterdir()) == sorted(before) and unchanged(taken, before)
    empty = tmp_path / "empty"
    empty.mkdir()
    with umask(0o022):
        assert main(["export", str(adapter_dir), "--format", fmt, "--out", str(empty)]) == 0
    assert list(empty.rglob("*.safetensors")) and wrong_modes(empty, 0o022) == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left
