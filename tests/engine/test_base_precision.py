"""model.base_precision=int8: the frozen base's Linear weights are stored int8 (torchao weight-only, one
scale per output row), the LoRA trains on top in fp32, a checkpoint leaves the quantized weights out and
the resumed run repeats the straight one, and the adapter merged into the full-precision base (what
`framer-ds export` does) differs from the weights the run trained through by at most half an int8 step.

Bound of the merge comparison, per output row r: symmetric per-row int8 stores round(W[r, :] / s_r) with
s_r = max|W[r, :]| / 127, so |W - dequant(W)| <= s_r / 2 (fp32 rounding of s_r and of the product adds
~1e-7 relative, covered by a 1e-6 margin). The LoRA delta is added alike on both sides, so it cancels.
Resume vs straight is exact: the base is quantized again from the same weights (round-to-nearest is
deterministic) and everything else restores as without quantization.
"""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel

from conftest import mlp_config, read_metrics, train_in_process
from framer_ds.config.errors import ConfigError
from framer_ds.engine.base_precision import quantize_frozen_base
from framer_ds.tasks.run_config import load_exported_task

MODEL = {"lora_rank": 4, "base_precision": "int8"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("int8")
    sections = {"model": MODEL, "train": {"length.steps": 4, "checkpoint.every.steps": 2}}
    straight = mlp_config(root / "straight.yaml", root / "straight", **sections)
    train_in_process(straight)
    resumed = mlp_config(root / "resumed.yaml", root / "resumed", **sections)
    train_in_process(resumed, ["train.length.steps=2"])
    train_in_process(resumed, ["train.resume=latest"])
    return root


def test_an_int8_base_resumes_exactly_and_checkpoints_leave_it_out(runs):
    straight = [line["loss"] for line in read_metrics(runs / "straight")[0]]
    resumed = [line["loss"] for line in read_metrics(runs / "resumed")[0]]
    assert len(straight) == 4 and resumed == straight
    text = (runs / "straight" / "metrics.jsonl").read_text()  # its first line: the run summary
    assert "int8 weight-only: 5 frozen Linear layers" in text
    from safetensors.torch import load_file

    saved = load_file(runs / "straight" / "checkpoints" / "step_4" / "model.safetensors")
    assert any("lora_A" in name for name in saved), sorted(saved)
    assert not any(name.endswith("base_layer.weight") for name in saved), sorted(saved)  # int8: left out


def test_the_merged_export_is_the_trained_weights_within_half_an_int8_step(runs):
    task = load_exported_task(runs / "straight" / "final")
    config = task.config.model_copy(update={"model": task.config.model.model_copy(update={"lora_rank": 0})})
    base = type(task)(config).build_model()  # the full-precision base, as `framer-ds export` reads it
    reference = {name: p.detach().clone() for name, p in base.named_parameters()}
    merged = PeftModel.from_pretrained(base, runs / "straight" / "final").merge_and_unload()

    stored_base = type(task)(config).build_model().requires_grad_(False)  # what the run trained through
    quantize_frozen_base(stored_base, "int8")
    trained = PeftModel.from_pretrained(stored_base, runs / "straight" / "final")
    for index, layer in enumerate(merged.net):
        if not isinstance(layer, torch.nn.Linear):
            continue
        full = reference[f"net.{index}.weight"]
        lora = trained.base_model.model.net[index]
        stored = lora.base_layer.weight.dequantize()
        effective = stored + lora.get_delta_weight("default")
        half_step = full.abs().amax(dim=1, keepdim=True) / 127 / 2
        gap = (layer.weight - effective).abs()
        assert (gap <= half_step * (1 + 1e-6) + 1e-9).all(), f"net.{index}: {(gap - half_step).max()}"
        assert gap.max() > 0  # really quantized: the bound is not met by equality


def test_int8_without_a_frozen_linear_and_fp8_on_a_cpu_are_refused():
    trainable = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ConfigError, match=r"no frozen nn\.Linear"):
        quantize_frozen_base(trainable, "int8")
    frozen = torch.nn.Sequential(torch.nn.Linear(4, 4)).requires_grad_(False)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="fp8 weights need a CUDA GPU"):
            quantize_frozen_base(frozen, "fp8")


@pytest.mark.parametrize("json_name", ["zero2.json", "zero3.json"])
def test_deepspeed_refuses_a_quantized_base_with_the_reason(json_name):
    from framer_ds.config.launch_check import check_launch_configs
    from framer_ds.config.train_config import TrainConfig

    path = f"configs/deepspeed/{json_name}"
    problems = check_launch_configs(TrainConfig(), deepspeed_config=path, base_precision="int8")
    assert any("Couldn't swap" in p.message and "base_precision=full" in p.message for p in problems), (
        problems
    )
    assert not check_launch_configs(TrainConfig(), deepspeed_config=path)


def test_fsdp2_refuses_a_quantized_base_with_the_reason():
    from framer_ds.config.launch_check import check_launch_configs
    from framer_ds.config.train_config import TrainConfig

    path = "configs/accelerate_fsdp2_cpu_2proc.yaml"
    problems = check_launch_configs(TrainConfig(), accelerate_config=path, base_precision="int8")
    assert [p.where for p in problems] == ["model.base_precision"], problems
    assert "aten.split" in problems[0].message
    assert not check_launch_configs(TrainConfig(), accelerate_config=path)


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_an_int8_base_trains_under_ddp(tmp_path):
    """DDP broadcasts every parameter when it wraps the model, which torchao's weights cannot be flattened
    for (NotImplementedError on aten.view before engine.base_precision.keep_quantized_out_of_ddp)."""
    from conftest import launch_strategy_run

    model = {**MODEL}
    run_dir = launch_strategy_run("ddp", tmp_path, "ddp", model=model, train={"length.steps": 4})
    losses = [line["loss"] for line in read_metrics(run_dir)[0]]
    assert len(losses) == 4 and all(0 < loss < 10 for loss in losses), losses
    assert (run_dir / "final" / "adapter_model.safetensors").is_file()
