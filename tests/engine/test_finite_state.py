"""engine/finite.py: what counts as a finite training state, on the tensors each rank holds."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from accelerate import Accelerator

from conftest import REPO, accelerate_launch_cmd, launch_env, strategy_launch_args
from framer_ds.engine.finite import Finiteness, agreed_finiteness, all_finite, optimizer_tensors


def test_large_finite_values_are_finite_and_any_nan_or_inf_is_not():
    # 1e30 squared overflows float32 (max ~3.4e38): a 2-norm or a sum of squares would call these weights
    # non-finite; the inf-norm (max |x|) cannot overflow. Empty tensors (unsharded ZeRO-3 placeholders)
    # and integer tensors are skipped.
    big = torch.full((1000,), 1e30)
    assert all_finite([big, big.to(torch.bfloat16), torch.empty(0), torch.arange(3)])
    for bad in (float("nan"), float("inf"), -float("inf")):
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            poisoned = torch.ones(7, dtype=dtype)
            poisoned[3] = bad
            assert not all_finite([big, poisoned]), (bad, dtype)


def test_the_optimizer_state_behind_accelerates_wrapper_is_checked():
    """Adam's moment overflowing to inf leaves the weights finite (its update is m / sqrt(inf) = 0), and
    the check still finds it: the state of the torch optimizer inside accelerate's wrapper is read."""
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    assert agreed_finiteness(accelerator, model, optimizer) == Finiteness(weights=True, optimizer=True)
    assert any(t is model.weight for t in optimizer_tensors(optimizer))
    state = optimizer.optimizer.state[model.weight]
    state["exp_avg_sq"][0, 0] = float("inf")
    found = agreed_finiteness(accelerator, model, optimizer)
    assert found == Finiteness(weights=True, optimizer=False)
    assert found.describe() == "the optimizer state is not finite (NaN/inf)"
    with torch.no_grad():
        model.bias[1] = float("nan")
    assert (
        agreed_finiteness(accelerator, model).describe() == "the trainable weights are not finite (NaN/inf)"
    )
    assert (
        agreed_finiteness(accelerator, model, optimizer).describe()
        == "the trainable weights and the optimizer state are not finite (NaN/inf)"
    )


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)
# ZeRO-3 only: its shards cover both places a rank's view differs (parameter partitions and the fp32
# master partition with Adam's moments); ZeRO-2's optimizer is reached the same way (also passes, ~1 min
# more suite time).
@pytest.mark.parametrize("strategy", ["zero3"])
def test_a_nan_only_one_rank_holds_is_seen_by_every_rank(strategy, tmp_path):
    """Under ZeRO each rank holds a shard (ZeRO-3: of every parameter; both: of the fp32 master weights
    and Adam's moments). A NaN put into rank 1's shard only must make BOTH ranks report it: saving is a
    collective, and a rank that took the other branch would wait in it forever."""
    cmd = accelerate_launch_cmd(
        *strategy_launch_args(strategy, tmp_path), "tests/finite_agreement_script.py", str(tmp_path)
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("finite_rank*.json"))]
    assert [r["rank"] for r in seen] == [0, 1], proc.stdout[-2000:]
    # rank 1 holds padding (the 1-element bias of the last layer is all padding on it); NaN there is no
    # NaN in the model: a rank's check reads only the real elements of its partitions
    assert seen[1]["padding"] > 0, seen
    for report in seen:
        assert report["clean"] is True
        assert report["weights"] == [False, True], report
        assert report["optimizer"] == [True, False], report
