"""LoRA under ZeRO-3: the saved adapter is never empty and reloads with plain peft.

With stage3_param_persistence_threshold 0 every LoRA matrix is partitioned, so a plain
`get_peft_model_state_dict` would see (0,)-shaped placeholders: this is the bug users hit.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from conftest import (
    REPO,
    abort_lines,
    accelerate_launch_cmd,
    launch_env,
    mlp_config,
    read_metrics,
    strategy_launch_args,
)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.mark.parametrize("strategy", ["zero3", "zero3_offload"])
def test_lora_adapter_from_zero3_is_complete_and_loads_with_peft(tmp_path, strategy):
    run_dir = tmp_path / "run"
    config = mlp_config(
        tmp_path / "c.yaml",
        run_dir,
        model={"lora_rank": 4},
        train={"length.steps": 6, "optimizer.learning_rate": 1e-2},
    )
    cmd = accelerate_launch_cmd(
        *strategy_launch_args(strategy, tmp_path), "-m", "framer_ds", "train", str(config)
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-5000:]
    # Every rank tears down cleanly (scripts/dev/exit_soak.py repeats this run N times).
    assert not abort_lines(proc.stderr), proc.stderr[-5000:]

    final = run_dir / "final"
    adapter = load_file(final / "adapter_model.safetensors")
    assert json.loads((final / "adapter_config.json").read_text())["r"] == 4
    assert len(adapter) == 10  # lora_A + lora_B for each of the 5 linears
    empty = [name for name, t in adapter.items() if t.numel() == 0]
    assert not empty, f"empty adapter tensors: {empty}"
    assert any(t.abs().sum() > 0 for name, t in adapter.items() if "lora_B" in name)  # trained, not init

    from framer_test_tasks import Mlp, RegressionSet

    torch.manual_seed(7)  # the base weights the task built (train.seed)
    model = PeftModel.from_pretrained(Mlp(32, 256, 4), final)
    data = RegressionSet(64, 32, seed=1, poison=set())
    with torch.no_grad():
        eval_loss = ((model(data.x) - data.y) ** 2).mean().item()
    assert eval_loss == pytest.approx(read_metrics(run_dir)[1][-1]["eval/loss"], rel=1e-5)
