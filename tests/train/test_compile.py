"""train.compile: the quickstart ViT with its 4 ViTLayer blocks compiled in place trains the eager losses,
with and without gradient checkpointing, and the run summary says what was compiled. Under ZeRO-2 and
FSDP2 (2 processes) the compiled blocks train the DDP losses: tests/engine/test_fsdp2.py, whose module
fixture's DDP quickstart run is the reference there.

Tolerance, 1e-3 relative per step: both runs are fp32 on CPU with dropout off, the same data and seed;
inductor fuses the blocks' pointwise ops and reorders fp32 sums (layer-norm statistics, GELU+matmul
epilogues, the softmax denominator), which moves each loss by ~1e-7 relative per step, growing through
Adam's updates to ~1e-6 over 4 steps (measured below 1e-5). A block that lost its gradient (a compiled
graph detached from the parameters) or ran twice moves the loss by >1e-2 by step 2.
"""

from __future__ import annotations

import pytest

from conftest import read_metrics, train_in_process

STEPS = 4


def losses(tmp_path, name: str, *overrides: str) -> list[float]:
    run_dir = tmp_path / name
    train_in_process(
        "configs/quickstart.yaml",
        [
            f"output_dir={run_dir}",
            f"train.length.steps={STEPS}",
            "train.micro_batch_size=16",
            "train.eval.every=null",
            "train.checkpoint.every=null",
            "train.eval.max_batches=1",
            "model.source.config.hidden_dropout_prob=0.0",  # inductor draws its own dropout masks
            *overrides,
        ],
    )
    train, _ = read_metrics(run_dir)
    return [line["loss"] for line in train]


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True], ids=["eager_blocks", "checkpointed_blocks"])
def test_compiled_blocks_train_the_eager_losses(tmp_path, capsys, checkpointing):
    gc = f"train.gradient_checkpointing={str(checkpointing).lower()}"
    eager = losses(tmp_path, "eager", gc)
    capsys.readouterr()
    compiled = losses(tmp_path, "compiled", gc, "train.compile=true")
    printed = capsys.readouterr().out
    assert "torch.compile" in printed and "4 repeated blocks (ViTLayer)" in printed, printed
    assert len(eager) == len(compiled) == STEPS
    for step, (a, b) in enumerate(zip(eager, compiled, strict=True), 1):
        assert b == pytest.approx(a, rel=1e-3), f"step {step}: eager {a}, compiled {b}"


def test_zero3_with_compile_is_refused_with_the_reason():
    from framer_ds.config.launch_check import check_launch_configs
    from framer_ds.config.train_config import TrainConfig

    problems = check_launch_configs(
        TrainConfig.model_validate({"compile": True}), deepspeed_config="configs/deepspeed/zero3.json"
    )
    assert [p.where for p in problems] == ["configs/deepspeed/zero3.json: zero_optimization.stage"], problems
    assert "train.compile=false" in problems[0].message and "dynamo" in problems[0].message
    compile_off = check_launch_configs(TrainConfig(), deepspeed_config="configs/deepspeed/zero3.json")
    assert not any("compile" in p.message for p in compile_off)
    zero2 = check_launch_configs(
        TrainConfig.model_validate({"compile": True}), deepspeed_config="configs/deepspeed/zero2.json"
    )
    assert not any("compile" in p.message for p in zero2)
