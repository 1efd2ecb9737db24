"""Keep DeepSpeed from importing and building two things framer_ds never uses, in every ZeRO rank.

1. The Muon optimizer. DeepSpeed 0.19's ZeRO optimizers import
`deepspeed.runtime.zero.muon.muon_optimizer` when they start (stage 1/2's and 3's `__init__`,
`is_zero_supported_optimizer`), only to ask `isinstance(optimizer, MuonWithAuxAdam)`, and stage 1/2
imports `original_muon.muon_update` at every gradient partition, to call it only for a Muon optimizer's
parameters. `original_muon`'s functions are wrapped by `deepspeed.runtime.compiler.compile()` when it is
imported: ~600 modules of torch.compile machinery beyond what any torch optimizer imports, 1.0-1.4 s of
CPU in each rank of each ZeRO launch (measured on a quiet 2-core machine, 1.6-1.8 s under load; torch,
DeepSpeed and accelerate together import in ~1.5 s), for answers framer_ds knows. framer_ds builds the
optimizer itself (AdamW, 8-bit Adam, or the DeepSpeedCPUAdam accelerate swaps in under offload; a
DeepSpeed JSON with an `optimizer` block is refused, config/deepspeed_json_rules.py), so no optimizer of
a framer_ds run is DeepSpeed's Muon and the answer is always no.

How: before DeepSpeed first imports them, the two modules' names are bound to stand-ins: a
`MuonWithAuxAdam` no object is an instance of, and a `muon_update` that DeepSpeed calls only for a Muon
optimizer (each raises, naming why, if anything ever builds or calls one). Where the real modules were
imported already (another library in the same process uses Muon), they are left alone.

2. The shared-memory all-reduce op on a CPU machine (`deepspeed_shm_comm`). DeepSpeed's communication
backend JIT-builds and loads it whenever its process group starts on the CPU accelerator, and uses it
only in `inference_all_reduce` (tensor-parallel inference); training's collectives go through
torch.distributed (gloo). The build is ~1 min of silence on 2 cores the first time a machine (a fresh
clone's venv, a CI runner) starts a DeepSpeed run, for an op no framer_ds run calls. DeepSpeed builds it
only when `deepspeed.ops.__compatible_ops__` says it is compatible, so that entry is set False; an
inference all-reduce, were one ever called, falls back to torch.distributed's all_reduce, as DeepSpeed
does wherever the op is missing.
"""

from __future__ import annotations

import sys
import types

MUON_PACKAGE = "deepspeed.runtime.zero.muon"
NOT_AVAILABLE = (
    "DeepSpeed's Muon optimizer is not available in a framer_ds run: framer_ds builds its optimizer from "
    "train.optimizer (framer_ds/engine/deepspeed_unused.py)"
)


class MuonWithAuxAdam:
    """The stand-in DeepSpeed's `isinstance` checks see: framer_ds never builds a Muon optimizer."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(NOT_AVAILABLE)


def muon_update(*args: object, **kwargs: object) -> None:
    """The stand-in stage 1/2 imports at each gradient partition and calls only for Muon's parameters."""
    raise RuntimeError(NOT_AVAILABLE)


STAND_INS: dict[str, dict[str, object]] = {
    f"{MUON_PACKAGE}.muon_optimizer": {"MuonWithAuxAdam": MuonWithAuxAdam},
    f"{MUON_PACKAGE}.original_muon": {"MuonWithAuxAdam": MuonWithAuxAdam, "muon_update": muon_update},
}


SHM_COMM_OP = "deepspeed_shm_comm"  # ShareMemCommBuilder.NAME


def skip_unused_deepspeed_parts() -> None:
    """Both skips of the module docstring; call before the Accelerator (and DeepSpeed's process group)
    is built."""
    skip_shm_comm_build()
    skip_muon_kernels()


def skip_shm_comm_build() -> None:
    """Mark the CPU shared-memory op incompatible, so DeepSpeed's backend neither builds nor loads it."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False


def skip_muon_kernels() -> None:
    """Bind DeepSpeed's Muon modules to the stand-ins, unless one was imported already (idempotent)."""
    if any(name in sys.modules for name in STAND_INS):
        return
    for name, members in STAND_INS.items():
        stand_in = types.ModuleType(name, __doc__)
        stand_in.__dict__.update(members)
        sys.modules[name] = stand_in
