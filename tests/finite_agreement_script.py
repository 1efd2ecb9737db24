"""Run under `accelerate launch` (2 processes, ZeRO): poison a tensor that only ONE rank holds and write
what `agreed_finiteness` returns on each rank to `<out_dir>/finite_rank<N>.json`
(tests/engine/test_finite_state.py reads them). A file per rank, not a printed line: two ranks' lines
on one shared stdout can interleave."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from framer_ds.engine.finite import agreed_finiteness, optimizer_tensors, trainable_tensors
from framer_ds.engine.zero_buffers import ParameterSizes, size_zero_buffers


def main() -> None:
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
    seen = {"rank": rank, "clean": agreed_finiteness(accelerator, model, optimizer).ok}
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
