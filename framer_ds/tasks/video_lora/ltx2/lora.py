"""Where a LoRA goes in diffusers' `LTX2VideoTransformer3DModel`: the video branch of every block.

Targets: video self-attention (`attn1`) and prompt cross-attention (`attn2`) q/k/v/out and the video
feed-forward (`ff.net.0.proj`, `ff.net.2`), what LTX-2's own trainer (ltx-trainer's video-only LoRA) and
diffusers' LTX-2 LoRA examples train. As peft `target_modules` each matches `transformer_blocks.N.<name>`
only: peft matches an entry by suffix after a dot, so `attn1.to_q` never matches `audio_attn1.to_q`, nor
`ff.net.2` `audio_ff.net.2`: the audio branch and the audio<->video cross-attention stay frozen.

Layouts:
- diffusers (`to_diffusers_state_dict`): `transformer.transformer_blocks.N.attn1.to_q.lora_A.weight`,
  what `LTX2*Pipeline.load_lora_weights` reads (ltx2/export.py writes it with diffusers' own writer).
- ComfyUI / LTX-2's own (`to_comfyui_state_dict`): `diffusion_model.<original module>.lora_A.weight` /
  `.lora_B.weight`, peft's scale folded into lora_B and no `.alpha`: the layout Lightricks' trainer
  writes (ltx-trainer `_save_checkpoint`: peft's keys with `diffusion_model.`), which ComfyUI's generic
  key map takes for every weight of its LTX-2 model (`comfy/lora.py` `model_lora_keys_unet`; its LoRA
  adapter reads `lora_B`/`lora_A` and, with no `.alpha`, scales by 1) and diffusers' LTX-2 loader reads
  back (`_convert_non_diffusers_ltx2_lora_to_diffusers`). A file with no alpha means scale 1 to each of
  them, so the delta is the same whoever loads it. Module names: inside `transformer_blocks` they are
  the original model's (ComfyUI's `comfy/ldm/lightricks/av_model.py` keeps them); a top-level module's
  original name is the inverse of diffusers' converter's rename table (`COMFYUI_TOP_LEVEL`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from framer_ds.tasks.video_lora.shared.comfyui_lora import lora_scale, refusal

LTX2_LORA_TARGETS = (
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_out.0",
    "ff.net.0.proj",
    "ff.net.2",
)


def lora_targets(lora: Any) -> list[str]:
    """model.lora's own modules when the config names others than the default, else LTX2_LORA_TARGETS
    (the default names SVD's attention layers: a resolved config dumps every key, so the value, not
    whether it was set, tells a user's choice apart)."""
    default = type(lora).model_fields["target_modules"].get_default(call_default_factory=True)
    named = lora.target_modules != default or lora.include_feed_forward or lora.include_projections
    return lora.targets() if named else list(LTX2_LORA_TARGETS)


def unwrapped(model: torch.nn.Module) -> Any:
    """The LTX-2 transformer inside a prepared model (DDP/DeepSpeed `.module`, then peft's), for what is
    not a forward: its RoPE coordinates and config."""
    inner = getattr(model, "module", model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def to_diffusers_state_dict(peft_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft keys (`base_model.model.<module>.lora_A.weight`) -> diffusers' (`transformer.<module>.lora_A
    .weight`), the layout `LTX2*Pipeline.load_lora_weights` reads; peft's alpha travels in the file's
    `lora_adapter_metadata` header (diffusers' `save_lora_weights`), so B is not rescaled."""
    return {
        f"transformer.{k.removeprefix('base_model.model.')}": v.contiguous()
        for k, v in peft_state_dict.items()
    }


# diffusers' top-level LTX-2 modules whose original (ComfyUI, Lightricks) name differs: the inverse of the
# linear layers' renames in diffusers' `_convert_non_diffusers_ltx2_lora_to_diffusers`. Each pair is
# checked against ComfyUI's own model by scripts/dev/make_ltx2_lora_golden.py (tests/golden/ltx2_lora_keys).
COMFYUI_TOP_LEVEL = {
    "proj_in": "patchify_proj",
    "audio_proj_in": "audio_patchify_proj",
    "time_embed": "adaln_single",
    "audio_time_embed": "audio_adaln_single",
    "av_cross_attn_video_scale_shift": "av_ca_video_scale_shift_adaln_single",
    "av_cross_attn_video_a2v_gate": "av_ca_a2v_gate_adaln_single",
    "av_cross_attn_audio_scale_shift": "av_ca_audio_scale_shift_adaln_single",
    "av_cross_attn_audio_v2a_gate": "av_ca_v2a_gate_adaln_single",
}
# top-level modules named alike in both (the blocks' attention, feed-forward and audio-video layers too)
SAME_NAME = (
    "transformer_blocks",
    "caption_projection",
    "audio_caption_projection",
    "proj_out",
    "audio_proj_out",
)
_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(?:transformer\.)?(.+)\.lora_([AB])\.weight$")


def comfyui_module(module: str) -> str:
    """A diffusers LTX-2 transformer module -> its name in the original model (ComfyUI's, Lightricks');
    a module with no name checked against ComfyUI's model is refused by name."""
    head, dot, rest = module.partition(".")
    if head in SAME_NAME:
        return module
    if head in COMFYUI_TOP_LEVEL:
        return COMFYUI_TOP_LEVEL[head] + dot + rest
    known = ", ".join((*SAME_NAME, *COMFYUI_TOP_LEVEL))
    raise refusal(f"{module} is not a module of LTX-2's transformer with a known ComfyUI name ({known})")


def to_comfyui_state_dict(
    peft_state_dict: Mapping[str, torch.Tensor], adapter_config: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """peft's adapter tensors -> `diffusion_model.<original module>.lora_A.weight` / `.lora_B.weight` with
    lora_B scaled by peft's alpha / r (or alpha / sqrt(r)) and no `.alpha` (module docstring): ComfyUI's
    delta, 1 * lora_B @ lora_A, is then peft's scale * B @ A."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in peft_state_dict.items():
        match = _PEFT_KEY.match(key)
        if match is None:
            raise refusal(f"{key} is not a LoRA matrix (a fully trained module has no LoRA key)")
        pairs.setdefault(match[1], {})[match[2]] = tensor
    converted: dict[str, torch.Tensor] = {}
    for module, parts in sorted(pairs.items()):
        if set(parts) != {"A", "B"}:
            raise refusal(f"{module} has lora_{''.join(parts)} only; a LoRA needs lora_A and lora_B")
        down, up = parts["A"], parts["B"]
        if down.dim() != 2:
            raise refusal(f"{module} is a convolution LoRA; LTX-2's transformer has linear layers only")
        scale = lora_scale(down.shape[0], adapter_config)
        prefix = f"diffusion_model.{comfyui_module(module)}"
        converted[f"{prefix}.lora_A.weight"] = down.contiguous()
        converted[f"{prefix}.lora_B.weight"] = (up * scale if scale != 1.0 else up).contiguous()
    if not converted:
        raise refusal("it holds no LoRA matrices")
    return converted
