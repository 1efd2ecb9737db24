"""Run under `accelerate launch` (2 processes, ZeRO): poison a tensor that only ONE rank holds and write
what `agreed_finiteness` returns on each rank to `<out_dir>/finite_rank<N>.json`
(tests/engine/test_finite_state.py reads them). A file per rank, not a printed line: two ranks' lines
on one shared stdout can interleave.

Before any check, every element of ZeRO-3's partition PADDING (the elements past a parameter's end, in
the bf16/fp32 partition, the fp32 master and Adam's moments) is set to NaN: DeepSpeed leaves the padding
uninitialised, so a real run finds whatever the allocator's memory held there, now and then a NaN, and a
check that read it stopped healthy runs (a CI run reported rank state "not clean" after one clean step)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from framer_ds.engine.deepspeed_unused import skip_unused_deepspeed_parts
from framer_ds.engine.finite import agreed_finiteness, optimizer_tensors, trainable_tensors
from framer_ds.engine.zero_buffers import ParameterSizes, size_zero_buffers


def poison_zero3_padding(model: torch.nn.Module, zero_optimizer: object, rank: int) -> int:
    """Set every padding element this rank holds to NaN; returns how many. Computed here from DeepSpeed's
    own attributes (not framer_ds's helpers): partition i of a parameter holds elements
    [i * partition, (i + 1) * partition) of it, the rest of the partition is padding."""
    poisoned = 0
    for param in model.parameters():
        partition = param.ds_tensor.ds_numel
        held = max(0, min(partition, param.ds_numel - rank * partition))
        param.ds_tensor.data.view(-1)[held:] = float("nan")
        poisoned += partition - held
    inner = zero_optimizer.optimizer
    for params, master in zip(
        zero_optimizer.fp16_groups, zero_optimizer.fp32_partitioned_groups_flat, strict=True
    ):
        offset = 0
        for param in params:
            partition = param.partition_numel()
            held = max(0, min(partition, param.ds_numel - rank * partition))
            for tensor in [master, *(v for v in inner.state[master].values() if v.numel() == master.numel())]:
                tensor.data.view(-1)[offset + held : offset + partition] = float("nan")
            offset += partition
    return poisoned


def main() -> None:
    # As every framer_ds rank does before its Accelerator (engine/accelerator.py): without it, DeepSpeed
    # imports its Muon code and JIT-builds and loads its CPU shared-memory op, ~1 min of CPU in a fresh
    # venv, for nothing this check uses.
    skip_unused_deepspeed_parts()
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(torch.randn(8, 8), batch_size=4)
    plugin = accelerator.state.deepspeed_plugin  # the JSON's "auto" buffers, as the loop sizes them
    size_zero_buffers(plugin.deepspeed_config, ParameterSizes.of(model), "no")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:  # one step: Adam's moments exist
        accelerator.backward(model(batch).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    rank = accelerator.process_index
    padding = poison_zero3_padding(model, optimizer.optimizer, rank)
    seen = {"rank": rank, "padding": padding, "clean": agreed_finiteness(accelerator, model, optimizer).ok}
    for what, tensors in (("weights", trainable_tensors(model)), ("optimizer", optimizer_tensors(optimizer))):
        held = [t for t in tensors if t.numel() and t.is_floating_point()]
        seen[f"{what}_held"] = sum(t.numel() for t in held)
        poisoned = held[-1] if rank == 1 else None  # rank 1's shard only
        if poisoned is not None:
            saved = poisoned.detach().clone()
            poisoned.data.view(-1)[0] = float("nan")
        found = agreed_finiteness(accelerator, model, optimizer)
        seen[what] = [found.weights, found.optimizer]
        if poisoned is not None:
            poisoned.data.copy_(saved)
    Path(sys.argv[1], f"finite_rank{rank}.json").write_text(json.dumps(seen))
    accelerator.end_training()


if __name__ == "__main__":
    main()
