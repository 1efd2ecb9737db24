"""A ZeRO rank no longer imports DeepSpeed's Muon code nor builds and loads its CPU shared-memory
all-reduce op, neither of which framer_ds uses (framer_ds/engine/deepspeed_unused.py): DeepSpeed's ZeRO-2
and ZeRO-3 optimizers start and step with an AdamW without `original_muon` (~600 modules of
torch.compile machinery on top of what any torch optimizer imports) and without `deepspeed_shm_comm`
(a ~1 min JIT build on a fresh machine, used only by tensor-parallel inference)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import free_port, launch_env

# One process, world size 1 over gloo, DeepSpeed's CPU accelerator: the ZeRO optimizer as a rank builds
# it, for each stage. Prints whether DeepSpeed's Muon code was imported and its shm op loaded, and each
# stage's two losses.
RANK = """
import json, os, sys
{skip}
import deepspeed, torch
deepspeed.init_distributed(dist_backend="gloo")
losses = {{}}
for stage in {stages}:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    config = {{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {{"stage": stage}}}}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    losses[stage] = []
    for _ in range(2):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses[stage].append(loss.item())
muon = sys.modules.get("deepspeed.runtime.zero.muon.original_muon")  # a stand-in has no file
shm = deepspeed.comm.comm.cdb.shm_comm_op is not None
print(json.dumps({{"muon": hasattr(muon, "__file__"), "shm": shm, "losses": losses}}))
"""
SKIP = "from framer_ds.engine.deepspeed_unused import skip_unused_deepspeed_parts as skip; skip()"


def _start(stages: list[int], skip: bool) -> dict:
    env = {**launch_env(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    code = RANK.format(skip=SKIP if skip else "", stages=stages)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_zero2_and_zero3_ranks_start_and_step_without_muon_or_the_shm_op() -> None:
    started = _start([2, 3], skip=True)
    assert not started["muon"] and not started["shm"], started
    assert all(second < first for first, second in started["losses"].values()), started  # they stepped


def test_without_the_skips_deepspeed_imports_muon_and_loads_the_shm_op() -> None:
    """The costs the skips remove are real on this DeepSpeed (if a release stops importing Muon or
    loading the op at ZeRO's start, this fails and that skip can go)."""
    started = _start([2], skip=False)
    assert started["muon"] and started["shm"], started


def test_the_stand_ins_are_never_usable_and_a_real_import_is_kept(monkeypatch) -> None:
    from framer_ds.engine import deepspeed_unused

    optimizer, update = deepspeed_unused.STAND_INS
    for name in (optimizer, update):
        monkeypatch.delitem(sys.modules, name, raising=False)
    deepspeed_unused.skip_muon_kernels()
    with pytest.raises(RuntimeError, match="not available in a framer_ds run"):
        sys.modules[optimizer].MuonWithAuxAdam([])
    with pytest.raises(RuntimeError, match="not available in a framer_ds run"):
        sys.modules[update].muon_update(None, None, 0.9)
    elsewhere = object()  # the real module, imported by something else first
    monkeypatch.setitem(sys.modules, optimizer, elsewhere)
    monkeypatch.delitem(sys.modules, update)
    deepspeed_unused.skip_muon_kernels()
    assert sys.modules[optimizer] is elsewhere and update not in sys.modules
