"""`model.base_precision`: the frozen base's nn.Linear weights stored int8 (or fp8) weight-only, LoRA and
every other trainable parameter kept in full precision on top (QLoRA-style), through torchao.

Why after the task builds its model, and by `requires_grad`: which parameters are frozen is what every
task already states (a peft LoRA freezes its base layers; `Task.build_model` marks what trains), so one
rule covers every task and base model without a hook per task: a Linear whose weight does not train is
quantized, a Linear that trains (a LoRA matrix, a full fine-tune) is left alone. The trainable model still
goes through `accelerator.prepare` as before.

What it does not change: exports. A task exports its trainable parameters (a LoRA adapter) or merges it
into the base read from disk at full precision (`framer-ds export`), so `final/` is the same format; the
adapter learnt against the dequantized base, which differs from the full-precision one by at most half a
quantization step per weight (scale = max |row| / 127 for int8; tests/engine/test_base_precision.py).
Checkpoints leave the quantized weights out (`quantized_names`): they are rebuilt from the base on
resume, as the frozen base always is.
"""

from __future__ import annotations

import torch

from framer_ds.config.errors import ConfigError, ConfigProblem

FP8_MIN_CAPABILITY = (8, 9)
"""fp8 matmuls need Ada / Hopper (compute capability 8.9+); torchao's fp8 kernels need a CUDA GPU."""


def fp8_problem() -> str | None:
    """Why fp8 cannot run on this machine, or None."""
    if not torch.cuda.is_available():
        return "fp8 weights need a CUDA GPU of compute capability 8.9+ (Ada, Hopper); this machine has none"
    capability = torch.cuda.get_device_capability()
    if capability < FP8_MIN_CAPABILITY:
        major, minor = capability
        return f"fp8 weights need compute capability 8.9+ (Ada, Hopper); this GPU is {major}.{minor}"
    return None


def _frozen_linear(module: torch.nn.Module, _fqn: str) -> bool:
    return isinstance(module, torch.nn.Linear) and not module.weight.requires_grad


def quantize_frozen_base(model: torch.nn.Module, precision: str) -> str:
    """Store every frozen nn.Linear weight of `model` in `precision` ("int8" or "fp8"), in place; returns
    what was quantized, for the run summary. A model with no frozen Linear (a full fine-tune) is refused:
    the setting would do nothing."""
    frozen = [m for m in model.modules() if _frozen_linear(m, "")]
    if not frozen:
        problem = ConfigProblem(
            "model.base_precision",
            f"is {precision!r} but the model has no frozen nn.Linear to quantize (every Linear trains, e.g. "
            "a full fine-tune): set model.base_precision=full or train a LoRA",
        )
        raise ConfigError([problem])
    if precision == "fp8" and (reason := fp8_problem()) is not None:
        raise ConfigError([ConfigProblem("model.base_precision", f"is 'fp8': {reason}; use int8")])
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    config = Int8WeightOnlyConfig() if precision == "int8" else Float8WeightOnlyConfig()
    before = sum(m.weight.numel() for m in frozen)
    quantize_(model, config, filter_fn=_frozen_linear)
    keep_quantized_out_of_checkpoints(model)
    keep_quantized_out_of_ddp(model)
    return f"{precision} weight-only: {len(frozen)} frozen Linear layers, {before:,} weights"


def quantized_names(model: torch.nn.Module) -> set[str]:
    """State-dict names of the quantized (tensor-subclass) frozen weights."""
    return {
        name
        for name, param in model.named_parameters()
        if not param.requires_grad and type(param.data) is not torch.Tensor
    }


def keep_quantized_out_of_checkpoints(model: torch.nn.Module) -> None:
    """The model's state dict (what `save_state` writes) without the quantized frozen weights, and a load
    that does not miss them. Why: safetensors cannot store torchao's tensors (accelerate fails reading
    their storage), and they need no storing: resume rebuilds the frozen base from its files and
    quantizes it again, bit for bit (round-to-nearest of the same weights). Not left to
    engine/checkpoint_weights.py, which drops every frozen parameter from what is written: that leaves
    `model.state_dict()` itself whole, and safetensors' `load_model` reads it on resume, where torchao's
    tensors fail its storage check (the SVD-XT 24 GB smoke's resume did; the int8 resume test too)."""
    names = quantized_names(model)

    def drop(_module: torch.nn.Module, state_dict: dict, prefix: str, _metadata: object) -> None:
        for name in names:
            state_dict.pop(prefix + name, None)

    def forgive(_module: torch.nn.Module, incompatible: object) -> None:
        missing = incompatible.missing_keys  # type: ignore[attr-defined]
        missing[:] = [key for key in missing if not any(key.endswith(name) for name in names)]

    model.register_state_dict_post_hook(drop)
    model.register_load_state_dict_post_hook(forgive)


def keep_quantized_out_of_ddp(model: torch.nn.Module) -> None:
    """DDP leaves the quantized frozen weights alone. Why: DDP broadcasts every parameter from rank 0 when
    it wraps the model, flattening them (aten.view), which torchao's tensors do not implement; the
    frozen base needs no broadcast, each rank loads the same files and rounds them alike, and DDP
    reduces only gradients, which these weights have none of."""
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, sorted(quantized_names(model)))
