"""Which CLIP context each pixel's temporal cross-attention reads: diffusers' order or Framer's.

In SVD's `TransformerSpatioTemporalModel` every temporal block cross-attends, for each of the h*w pixels
of each batch item, to that item's context (its first frame's `encoder_hidden_states`). Diffusers lays
this out as `[B, h*w] -> B*h*w` rows, row `b*h*w + p` holding item b's context, which is what the
temporal block's rows (item-major too) need. Framer's fork (aim-uofa/Framer at d0ba81f,
`models_diffusers/transformer_temporal.py` lines 313-322) broadcasts `[h*w, B]` instead and reshapes
the same way, so row r holds the context of item `r mod B`. At batch 1 both are the same; at batch
B > 1, classifier-free guidance's batch of 2 included, pixels of one item read other items' contexts
(the unconditional and conditional halves mix). Framer's checkpoints were trained, and are sampled by
Framer, with that layout, so a Framer base must run it to compute what Framer computes.

`set_temporal_context_order(model, "framer")` installs a forward pre-hook on every
`TemporalBasicTransformerBlock` of `model` (UNet, ControlNet, or a module holding both) that rearranges
the context diffusers built into Framer's layout; diffusers' own forward does the rest. "diffusers"
removes the hooks. Peft wraps only the linear layers inside the blocks, so the hooks survive LoRA and
its merge.
"""

from __future__ import annotations

from torch import Tensor, nn

from framer_ds.tasks.video_lora.svd.options import TEMPORAL_CONTEXT_ORDERS, TemporalContextOrder

_HANDLE = "_framer_ds_temporal_context_hook"


def framer_time_context(time_context: Tensor, pixels: int) -> Tensor:
    """Diffusers' temporal context [B*h*w, L, D] (row `b*h*w + p`: item b) -> Framer's (row r: item
    `r mod B`), built as Framer builds it: the per-item context broadcast to [h*w, B] and flattened."""
    rows = time_context.shape[0]
    if rows % pixels:
        raise ValueError(f"temporal context of {rows} rows is not a whole number of {pixels}-pixel items")
    per_item = time_context.reshape(rows // pixels, pixels, *time_context.shape[1:])[:, 0]
    return per_item[None].expand(pixels, *per_item.shape).reshape(time_context.shape)


def _to_framer_order(module: nn.Module, args: tuple, kwargs: dict):
    context = kwargs.get("encoder_hidden_states")
    if context is None:
        return None
    hidden_states = args[0] if args else kwargs["hidden_states"]
    pixels = hidden_states.shape[1]  # [B*F, h*w, C]
    return args, {**kwargs, "encoder_hidden_states": framer_time_context(context, pixels)}


def temporal_blocks(model: nn.Module) -> list[nn.Module]:
    from diffusers.models.attention import TemporalBasicTransformerBlock

    return [m for m in model.modules() if isinstance(m, TemporalBasicTransformerBlock)]


def set_temporal_context_order(model: nn.Module, order: TemporalContextOrder) -> nn.Module:
    """Make every temporal block of `model` read its context in `order` (idempotent: setting it again
    replaces the hooks, it never rearranges twice). Returns the model."""
    if order not in TEMPORAL_CONTEXT_ORDERS:
        raise ValueError(f"unknown temporal context order {order!r}; use one of {TEMPORAL_CONTEXT_ORDERS}")
    blocks = temporal_blocks(model)
    if order == "framer" and not blocks:
        raise ValueError(f"{type(model).__name__} has no temporal transformer blocks to reorder")
    for block in blocks:
        handle = getattr(block, _HANDLE, None)
        if handle is not None:
            handle.remove()
            delattr(block, _HANDLE)
        if order == "framer":
            setattr(block, _HANDLE, block.register_forward_pre_hook(_to_framer_order, with_kwargs=True))
    return model


def temporal_context_order(model: nn.Module) -> TemporalContextOrder:
    """The order `model`'s temporal blocks run (Framer's when any block carries the hook)."""
    return "framer" if any(hasattr(b, _HANDLE) for b in temporal_blocks(model)) else "diffusers"
