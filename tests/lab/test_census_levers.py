"""The planner counts the fit levers at their real size: an int8 frozen base at 1 byte per Linear weight
plus a 4-byte scale and a 1-byte zero point per output row (the other frozen tensors as before), 8-bit
Adam states as torchao stores them (tests/train/test_optimizer_8bit.py checks `state_bytes` against
torchao's own tensors), and the DDP estimate drops by exactly what those levers save."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from framer_ds.engine.base_precision import quantize_frozen_base
from framer_ds.lab.census import census_of
from framer_ds.lab.memory_model import estimate


def lora_mlp() -> torch.nn.Module:
    base = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    return get_peft_model(base, LoraConfig(r=8, target_modules=["0", "2"]))


def test_int8_base_and_8bit_states_are_counted_at_their_stored_size():
    model = lora_mlp()
    full = census_of(model)
    levers = census_of(model, base_precision="int8", optimizer="adamw_8bit")
    weights = 256 * 512 * 2
    assert full.frozen - levers.frozen == weights  # the Linear weights left the full-precision count
    assert levers.quantized_frozen_bytes == weights + 5 * (512 + 256)  # fp32 scale + int8 zero point a row
    # what the run really stores, read from torchao's tensors: int8 codes + one scale per row
    quantize_frozen_base(model, "int8")
    stored = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not module.weight.requires_grad:
            weight = module.weight
            stored += sum(
                t.numel() * t.element_size() for t in (weight.qdata, weight.scale, weight.zero_point)
            )
    assert stored == levers.quantized_frozen_bytes
    # LoRA A 8x256 and B 256x8 (2,048 values: under torchao's 4,096, fp32 moments, 8 bytes a value);
    # B 512x8 and A 8x512 (4,096: two 1-byte moments + two fp32 scales per 256 values)
    lora = [p.numel() for p in model.parameters() if p.requires_grad]
    assert sorted(lora) == [2048, 2048, 4096, 4096]
    assert levers.optimizer_state_bytes == 2 * 2048 * 8 + 2 * (2 * 4096 + 2 * 4 * 4096 // 256)
    saved = estimate("ddp", full, 1, "no", 0).peak() - estimate("ddp", levers, 1, "no", 0).peak()
    assert saved == (4 * weights - levers.quantized_frozen_bytes) + (8 * sum(lora) - levers.adam_bytes())


def test_the_plan_marks_strategies_the_levers_cannot_run_with():
    from framer_ds.lab.plan_rows import lever_refusal

    model = lora_mlp()
    int8 = census_of(model, base_precision="int8")
    states = census_of(model, optimizer="adamw_8bit")
    assert lever_refusal("ddp", int8) == "" and lever_refusal("ddp", states) == ""
    assert all("model.base_precision" in lever_refusal(s, int8) for s in ("zero2", "zero3", "fsdp2"))
    assert lever_refusal("fsdp2", states) == "" and "adamw_8bit" in lever_refusal("zero2_offload", states)
    assert lever_refusal("zero3", census_of(model)) == ""
