"""`train.compile`: regional torch.compile of the trained model's repeated blocks.

Why regional: compiling the whole model traces it once, end to end, which for a video UNet or a
24-layer transformer takes minutes and recompiles on every new shape. The repeated blocks are the same
code N times; compiled in place (`nn.Module.compile`, as diffusers' `compile_repeated_blocks` and
finetrainers do), dynamo traces one block and reuses the graph for its siblings, so compile time is
about one block's. The task already names those blocks for FSDP2 (`Task.fsdp_block_classes`): the same
list serves both. `nn.Module.compile` compiles in place, so state-dict keys, exports, checkpoints and
resume see the plain module (a `torch.compile(model)` wrapper would prefix every key with `_orig_mod.`).
"""

from __future__ import annotations

import torch


def compile_repeated_blocks(model: torch.nn.Module, block_classes: list[str]) -> str:
    """Compile, in place, every submodule whose class is one of `block_classes`; a model naming no
    blocks (a small MLP) is compiled whole. Returns what was compiled, for the run summary.

    Gradient checkpointing wraps each block's `__call__`, which `nn.Module.compile` routes to the
    compiled forward, so a checkpointed block recomputes through the same compiled graph."""
    wanted = set(block_classes)
    blocks = [module for module in model.modules() if type(module).__name__ in wanted]
    if not blocks:
        model.compile()
        return f"whole model ({type(model).__name__}: it names no repeated blocks)"
    for block in blocks:
        block.compile()
    names = ", ".join(sorted({type(block).__name__ for block in blocks}))
    return f"{len(blocks)} repeated blocks ({names})"
