"""`validate`'s FSDP rules: every accelerate FSDP config that would silently train unsharded copies, or
against the training YAML, is refused, all problems at once; the shipped FSDP2 files pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from framer_ds.config.launch_check import check_launch_configs, check_runtime_environment
from framer_ds.config.schema import TrainConfig

REPO = Path(__file__).resolve().parents[2]
FSDP2_YAMLS = sorted((REPO / "configs").glob("accelerate_fsdp2_*.yaml"))
GOOD: dict[str, Any] = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "FSDP",
    "num_processes": 2,
    "fsdp_config": {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    },
}


def problems(tmp_path: Path, cfg: dict[str, Any], train: TrainConfig | None = None) -> list[str]:
    path = tmp_path / "acc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return [str(p) for p in check_launch_configs(train or TrainConfig(), path)]


def with_fsdp(**changes: Any) -> dict[str, Any]:
    return {**GOOD, "fsdp_config": {**GOOD["fsdp_config"], **changes}}


def test_shipped_fsdp2_configs_pass():
    names = {p.name for p in FSDP2_YAMLS}
    assert {
        "accelerate_fsdp2_cpu_2proc.yaml",
        "accelerate_fsdp2_4gpu.yaml",
        "accelerate_fsdp2_8gpu.yaml",
    } <= names
    assert "accelerate_fsdp2_multinode.yaml" in names
    for path in FSDP2_YAMLS:
        for mixed in ("no", "bf16"):
            found = check_launch_configs(
                TrainConfig(mixed_precision=mixed),
                path.relative_to(REPO),
                launch_flags={"main_process_ip": "a"},
            )
            assert found == [], (path, found)
        cfg = yaml.safe_load(path.read_text())
        assert cfg["fsdp_config"]["fsdp_version"] == 2 and "mixed_precision" not in cfg
        assert "fsdp_transformer_layer_cls_to_wrap" not in cfg["fsdp_config"]  # the task names its block


def test_good_config_has_no_problems(tmp_path):
    assert problems(tmp_path, GOOD) == []


def test_every_silent_fallback_is_reported_at_once(tmp_path):
    cfg = {
        **with_fsdp(fsdp_version=1),
        "use_cpu": True,
        "num_processes": 1,
        "deepspeed_config": {"zero_stage": 2},
    }
    found = problems(tmp_path, cfg)
    assert len(found) == 4, found
    assert any("fsdp_config.fsdp_version" in p and "set fsdp_version: 2" in p for p in found)
    assert any("use_cpu" in p and "drop FSDP silently" in p for p in found)
    assert any("num_processes" in p and "trains unsharded" in p for p in found)
    assert any(
        p.startswith(f"{tmp_path / 'acc.yaml'}: deepspeed_config") or "deepspeed_config" in p for p in found
    )


def test_missing_version_is_fsdp1(tmp_path):
    cfg = {**GOOD, "fsdp_config": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}}
    (found,) = problems(tmp_path, cfg)
    assert "accelerate defaults to 1" in found


def test_fsdp_config_under_another_distributed_type_is_ignored_by_accelerate(tmp_path):
    (found,) = problems(tmp_path, {**GOOD, "distributed_type": "MULTI_GPU"})
    assert "ignores fsdp_config" in found and "unsharded copy" in found


def test_fsdp1_keys_wrap_policy_and_state_dict(tmp_path):
    cfg = with_fsdp(
        fsdp_sharding_strategy="NO_SHARD",
        fsdp_use_orig_params=True,
        fsdp_auto_wrap_policy="SIZE_BASED_WRAP",
        fsdp_state_dict_type="FULL_STATE_DICT",
    )
    found = problems(tmp_path, cfg)
    assert len(found) == 4, found
    assert sum("FSDP1 setting" in p for p in found) == 2
    assert any("SIZE_BASED_WRAP without fsdp_min_num_params" in p for p in found)
    assert any("set SHARDED_STATE_DICT" in p for p in found)
    assert (
        problems(tmp_path, with_fsdp(fsdp_auto_wrap_policy="SIZE_BASED_WRAP", fsdp_min_num_params=10**6))
        == []
    )


def test_training_yaml_decides_precision_and_checkpointing(tmp_path):
    train = TrainConfig(mixed_precision="bf16", gradient_checkpointing=True)
    cfg = {
        **with_fsdp(fsdp_activation_checkpointing=True, fsdp_mixed_precision_policy={"param_dtype": "fp16"}),
        "mixed_precision": "fp16",
    }
    found = problems(tmp_path, cfg, train)
    assert len(found) == 3, found
    assert any("mixed_precision: is 'fp16' but train.mixed_precision is 'bf16'" in p for p in found)
    assert any("recomputed twice" in p for p in found)
    assert any("fsdp_mixed_precision_policy" in p and "'bf16'" in p for p in found)
    assert problems(tmp_path, with_fsdp(fsdp_activation_checkpointing=True)) == []


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"FSDP_VERSION": "2", "WORLD_SIZE": "2"}, []),
        ({"FSDP_VERSION": "1", "WORLD_SIZE": "2"}, ["FSDP_VERSION"]),
        ({"FSDP_VERSION": "2", "WORLD_SIZE": "1"}, ["WORLD_SIZE"]),
        (
            {"FSDP_VERSION": "2", "WORLD_SIZE": "2", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"},
            ["ACCUMULATION"],
        ),
    ],
)
def test_runtime_environment_under_fsdp(monkeypatch, env, expected):
    """What launch flags change after validate (--fsdp_version, --num_processes,
    --gradient_accumulation_steps) is checked again at training start."""
    for var in (
        "ACCELERATE_MIXED_PRECISION",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
        "ACCELERATE_USE_DEEPSPEED",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    found = [str(p) for p in check_runtime_environment(TrainConfig(gradient_accumulation_steps=2))]
    assert len(found) == len(expected), found
    for word, line in zip(expected, found, strict=True):
        assert word in line
