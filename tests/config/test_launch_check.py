"""Launch pre-flight checks: one test per rule, all-at-once reporting, shipped configs, runtime env."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from framer_ds.config.accelerate_yaml_rules import ACCELERATE_YAML_KEYS, IGNORED_WITH_CONFIG_FILE
from framer_ds.config.launch_check import check_launch_configs, check_runtime_environment
from framer_ds.config.launch_files import load_json_config, load_yaml_file
from framer_ds.config.schema import TrainConfig

REPO = Path(__file__).resolve().parents[2]
SHIPPED_JSONS = sorted((REPO / "configs" / "deepspeed").glob("*.json"))
SHIPPED_YAMLS = sorted((REPO / "configs").glob("accelerate_*.yaml"))
GOOD_DS: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 500000000},
}
DS_YAML: dict[str, Any] = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "DEEPSPEED",
    "num_processes": 2,
    "deepspeed_config": {"deepspeed_config_file": "ds.json"},
}
ENV_VARS = (
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "ACCELERATE_MIXED_PRECISION",
    "ACCELERATE_CONFIG_DS_FIELDS",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "ACCELERATE_GRADIENT_CLIPPING",
)


def write_json(tmp_path: Path, changes: dict[str, Any] | None = None, drop: tuple[str, ...] = ()) -> Path:
    cfg = copy.deepcopy(GOOD_DS)
    cfg.update(changes or {})
    for key in drop:
        cfg.pop(key)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return path


def write_yaml(tmp_path: Path, cfg: dict[str, Any], name: str = "acc.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def ds_problems(tmp_path: Path, train: TrainConfig | None = None, **kwargs: Any) -> list[str]:
    path = write_json(tmp_path, **kwargs)
    return [str(p) for p in check_launch_configs(train or TrainConfig(), deepspeed_config=path)]


def yaml_problems(tmp_path: Path, cfg: dict[str, Any], train: TrainConfig | None = None) -> list[str]:
    write_json(tmp_path)
    acc = write_yaml(tmp_path, cfg)
    return [str(p) for p in check_launch_configs(train or TrainConfig(), acc)]


@pytest.fixture(autouse=True)
def _in_tmp_and_clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


def test_good_config_has_no_problems(tmp_path: Path) -> None:
    assert ds_problems(tmp_path) == []
    assert yaml_problems(tmp_path, DS_YAML) == []


# --- rule a ---------------------------------------------------------------------------------------


def test_rule_a_batch_fields_must_be_auto(tmp_path: Path) -> None:
    found = ds_problems(
        tmp_path,
        changes={"gradient_accumulation_steps": 4, "train_batch_size": 64},
        drop=("train_micro_batch_size_per_gpu",),
    )
    assert len(found) == 3
    assert any("gradient_accumulation_steps" in p and "train.gradient_accumulation_steps" in p for p in found)
    assert any("train_batch_size" in p and '"auto"' in p for p in found)
    assert any(
        "train_micro_batch_size_per_gpu: missing" in p and "train.micro_batch_size" in p for p in found
    )


def test_rule_a_misspelled_batch_field_suggests_the_right_one(tmp_path: Path) -> None:
    found = ds_problems(tmp_path, changes={"gradient_clip": "auto"}, drop=("gradient_clipping",))
    assert any("gradient_clipping: missing" in p and "'gradient_clip'" in p for p in found)


def test_rule_a_precision_must_agree_with_training_yaml(tmp_path: Path) -> None:
    found = ds_problems(tmp_path, TrainConfig(mixed_precision="no"), changes={"bf16": {"enabled": True}})
    assert len(found) == 1
    assert "bf16.enabled" in found[0] and "train.mixed_precision is 'no'" in found[0]
    found = ds_problems(tmp_path, TrainConfig(mixed_precision="bf16"), changes={"bf16": {"enabled": "false"}})
    assert len(found) == 1 and "bf16.enabled: is false" in found[0]
    assert (
        ds_problems(tmp_path, TrainConfig(mixed_precision="bf16"), changes={"bf16": {"enabled": True}}) == []
    )
    assert ds_problems(tmp_path, TrainConfig(mixed_precision="fp16")) == []  # "auto" is always fine


def test_rule_a_both_precisions_enabled(tmp_path: Path) -> None:
    found = ds_problems(
        tmp_path,
        TrainConfig(mixed_precision="bf16"),
        changes={"bf16": {"enabled": True}, "fp16": {"enabled": True}},
    )
    assert any("both are enabled" in p for p in found)


def test_rule_a_precision_block_without_enabled(tmp_path: Path) -> None:
    found = ds_problems(tmp_path, TrainConfig(mixed_precision="bf16"), changes={"bf16": {}})
    assert len(found) == 1 and 'has no "enabled"' in found[0]


# --- rule b ---------------------------------------------------------------------------------------


def test_rule_b_accelerate_precision_differs(tmp_path: Path) -> None:
    plain = {"distributed_type": "MULTI_GPU", "num_processes": 2, "mixed_precision": "bf16"}
    found = yaml_problems(tmp_path, plain, TrainConfig(mixed_precision="fp16"))
    assert len(found) == 1
    assert "mixed_precision: is 'bf16'" in found[0] and "train.mixed_precision is 'fp16'" in found[0]
    assert (
        yaml_problems(tmp_path, {**plain, "mixed_precision": "no"}, TrainConfig(mixed_precision="fp16")) == []
    )
    assert yaml_problems(tmp_path, plain, TrainConfig(mixed_precision="bf16")) == []


# --- rule c ---------------------------------------------------------------------------------------


def test_rule_c_keys_ignored_next_to_a_json(tmp_path: Path) -> None:
    section = {"deepspeed_config_file": "ds.json", "zero_stage": 3, "gradient_clipping": 1.0}
    found = yaml_problems(tmp_path, {**DS_YAML, "deepspeed_config": {**section, "zero3_init_flag": True}})
    assert len(found) == 2
    assert any("deepspeed_config.zero_stage" in p and "will be ignored" in p for p in found)
    assert any("deepspeed_config.gradient_clipping" in p for p in found)


def test_rule_c_top_level_mixed_precision_rejected_even_no(tmp_path: Path) -> None:
    found = yaml_problems(tmp_path, {**DS_YAML, "mixed_precision": "no"})
    assert len(found) == 1 and "acc.yaml: mixed_precision" in found[0] and "even as 'no'" in found[0]


def test_rule_c_list_matches_accelerate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our list is accelerate's own: each key makes DeepSpeedPlugin raise, zero3_init_flag does not."""
    from accelerate.utils import DeepSpeedPlugin

    for key in sorted(IGNORED_WITH_CONFIG_FILE):
        monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", f"deepspeed_config_file,{key}")
        with pytest.raises(ValueError, match="will be ignored"):
            DeepSpeedPlugin(hf_ds_config=copy.deepcopy(GOOD_DS))
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "deepspeed_config_file,zero3_init_flag")
    DeepSpeedPlugin(hf_ds_config=copy.deepcopy(GOOD_DS))


# --- plugin values without a JSON, unknown YAML keys ----------------------------------------------


def test_yaml_plugin_values_must_match_training_yaml(tmp_path: Path) -> None:
    cfg = {**DS_YAML, "deepspeed_config": {"zero_stage": 2, "gradient_accumulation_steps": 1}}
    found = yaml_problems(tmp_path, cfg, TrainConfig(gradient_accumulation_steps=4))
    assert len(found) == 1 and "deepspeed_config.gradient_accumulation_steps: is 1" in found[0]


def test_unknown_accelerate_key_suggests_fix(tmp_path: Path) -> None:
    found = yaml_problems(tmp_path, {**DS_YAML, "num_proceses": 2})
    assert len(found) == 1 and "num_proceses" in found[0] and "'num_processes'" in found[0]


def test_accelerate_key_list_matches_accelerate() -> None:
    import dataclasses

    from accelerate.commands.config.config_args import ClusterConfig

    fields = {f.name for f in dataclasses.fields(ClusterConfig)}
    assert fields == ACCELERATE_YAML_KEYS - {"fp16", "dynamo_backend"}


# --- rules d-g ------------------------------------------------------------------------------------


def test_rule_d_buffer_fields_are_auto_or_element_counts(tmp_path: Path) -> None:
    """ "auto" is fine for every model (framer_ds sizes it, no hidden_size needed); anything DeepSpeed
    would reject only after the queue and the model load is named now, all at once."""
    zero = {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": 5e7,
        "stage3_max_live_parameters": "1e9",
        "stage3_max_reuse_distance": -1,
        "stage3_param_persistence_threshold": 2.5,
    }
    found = ds_problems(tmp_path, changes={"zero_optimization": zero})
    assert len(found) == 3
    assert all('use "auto"' in p for p in found)
    assert {p.split(": ")[1] for p in found} == {
        f"zero_optimization.stage3_{key}"
        for key in ("max_live_parameters", "max_reuse_distance", "param_persistence_threshold")
    }
    fixed = {
        **zero,
        "stage3_max_live_parameters": "auto",
        "stage3_max_reuse_distance": 0,
        "stage3_param_persistence_threshold": 100,
    }
    assert ds_problems(tmp_path, changes={"zero_optimization": fixed}) == []


def test_rule_e_offload_param_needs_zero3(tmp_path: Path) -> None:
    zero = {"stage": 2, "offload_param": {"device": "cpu"}}
    found = ds_problems(tmp_path, changes={"zero_optimization": zero})
    assert len(found) == 1 and "zero_optimization.offload_param" in found[0] and "ZeRO stage 3" in found[0]
    assert ds_problems(tmp_path, changes={"zero_optimization": {**zero, "stage": 3}}) == []


def test_rule_f_no_optimizer_or_scheduler_blocks(tmp_path: Path) -> None:
    changes = {"optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupLR"}}
    found = ds_problems(tmp_path, changes=changes)
    assert len(found) == 2
    assert any("optimizer: delete the optimizer block" in p for p in found)
    assert any("scheduler: delete the scheduler block" in p for p in found)


def test_rule_g_zero_section_and_stage(tmp_path: Path) -> None:
    found = ds_problems(tmp_path, drop=("zero_optimization",))
    assert len(found) == 1 and "zero_optimization: missing" in found[0]
    found = ds_problems(tmp_path, changes={"zero_optimization": {"stage": 4}})
    assert len(found) == 1 and "zero_optimization.stage: is 4" in found[0]


def test_rule_g_unreadable_files_are_problems_not_tracebacks(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"zero_optimization": {"stage": 2},}')
    found = [str(p) for p in check_launch_configs(TrainConfig(), deepspeed_config=bad_json)]
    assert len(found) == 1 and "cannot read JSON" in found[0] and "line 1" in found[0]
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("distributed_type: [DEEPSPEED\n")
    found = [str(p) for p in check_launch_configs(TrainConfig(), bad_yaml)]
    assert len(found) == 1 and "cannot read YAML" in found[0]
    assert load_json_config(tmp_path / "nope.json")[0] is None
    data, problems = load_yaml_file(tmp_path / "nope.yaml")
    assert data is None and "file not found" in problems[0].message


# --- rule h ---------------------------------------------------------------------------------------


def test_rule_h_deepspeed_without_json_or_stage(tmp_path: Path) -> None:
    found = yaml_problems(tmp_path, {**DS_YAML, "deepspeed_config": {"zero3_init_flag": False}})
    assert len(found) == 1 and "neither deepspeed_config_file nor zero_stage" in found[0]


def test_rule_h_use_cpu_with_deepspeed(tmp_path: Path) -> None:
    found = yaml_problems(tmp_path, {**DS_YAML, "use_cpu": True})
    assert len(found) == 1 and "acc.yaml: use_cpu" in found[0] and "silently drops DeepSpeed" in found[0]


def test_rule_h_json_with_non_deepspeed_yaml(tmp_path: Path) -> None:
    acc = write_yaml(tmp_path, {"distributed_type": "MULTI_GPU", "num_processes": 2})
    found = [str(p) for p in check_launch_configs(TrainConfig(), acc, write_json(tmp_path))]
    assert len(found) == 1 and "ignores --deepspeed_config_file" in found[0]


# --- reporting, resolution, shipped configs -------------------------------------------------------


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    changes = {"gradient_clipping": 1.0, "optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 7}}
    found = ds_problems(tmp_path, changes=changes)
    assert len(found) == 3
    for key in ("ds.json: gradient_clipping", "ds.json: optimizer", "ds.json: zero_optimization.stage"):
        assert any(key in p for p in found), key


def test_relative_json_in_yaml_is_found_from_launch_dir(tmp_path: Path) -> None:
    (tmp_path / "configs" / "deepspeed").mkdir(parents=True)
    (tmp_path / "configs" / "deepspeed" / "z.json").write_text(
        json.dumps({**GOOD_DS, "gradient_clipping": 2.0})
    )
    cfg = {**DS_YAML, "deepspeed_config": {"deepspeed_config_file": "configs/deepspeed/z.json"}}
    acc = write_yaml(tmp_path / "configs", cfg)
    found = [str(p) for p in check_launch_configs(TrainConfig(), acc)]
    assert found == [found[0]] and found[0].startswith("configs/deepspeed/z.json: gradient_clipping")


def test_json_next_to_yaml_is_checked_but_flagged(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "z.json").write_text(json.dumps({**GOOD_DS, "scheduler": {}}))
    cfg = {**DS_YAML, "deepspeed_config": {"deepspeed_config_file": "z.json"}}
    found = [str(p) for p in check_launch_configs(TrainConfig(), write_yaml(tmp_path / "configs", cfg))]
    assert len(found) == 2
    assert any("deepspeed_config_file" in p and "from where you launch" in p for p in found)
    assert any("z.json: scheduler" in p for p in found)


def test_missing_json_named_in_yaml(tmp_path: Path) -> None:
    cfg = {**DS_YAML, "deepspeed_config": {"deepspeed_config_file": "configs/deepspeed/zero9.json"}}
    found = [str(p) for p in check_launch_configs(TrainConfig(), write_yaml(tmp_path, cfg))]
    assert len(found) == 1 and "deepspeed_config_file" in found[0] and "not found" in found[0]


@pytest.mark.parametrize("mixed_precision", ["no", "bf16", "fp16"])
def test_shipped_configs_pass(monkeypatch: pytest.MonkeyPatch, mixed_precision: str) -> None:
    monkeypatch.chdir(REPO)  # shipped paths are relative to the repo root
    assert len(SHIPPED_JSONS) == 6 and len(SHIPPED_YAMLS) >= 3  # zero2, zero3 (+offload each), fp16, ++
    train = TrainConfig(mixed_precision=mixed_precision)
    head = {"main_process_ip": "node-a"}  # what a multi-node launch passes (checked on its own below)
    for acc in SHIPPED_YAMLS:
        assert check_launch_configs(train, acc.relative_to(REPO), launch_flags=head) == [], acc
        data, _ = load_yaml_file(acc)
        assert data is not None
        if data["distributed_type"] == "DEEPSPEED":
            for ds in SHIPPED_JSONS:
                found = check_launch_configs(
                    train, acc.relative_to(REPO), ds.relative_to(REPO), launch_flags=head
                )
                assert found == [], (
                    acc,
                    ds,
                )
    for ds in SHIPPED_JSONS:
        assert check_launch_configs(train, deepspeed_config=ds) == [], ds


def test_shipped_yaml_headers_give_the_command() -> None:
    for acc in SHIPPED_YAMLS:
        first = acc.read_text().splitlines()[0]
        assert first.startswith("#") and f"accelerate launch --config_file configs/{acc.name}" in first


def test_shipped_jsons_build_in_deepspeed() -> None:
    """DeepSpeed accepts the files (incl. the `_usage` key) once accelerate has filled the "auto"s."""
    from deepspeed.runtime.config import DeepSpeedConfig

    filled = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0}
    for ds in SHIPPED_JSONS:
        cfg = json.loads(ds.read_text())
        assert "--deepspeed_config_file configs/deepspeed/" + ds.name in cfg["_usage"]
        cfg.update(filled, train_batch_size=2, bf16={"enabled": False}, fp16={"enabled": False})
        assert DeepSpeedConfig(cfg).zero_optimization_stage == cfg["zero_optimization"]["stage"]


# --- runtime --------------------------------------------------------------------------------------


def test_runtime_without_deepspeed_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert check_runtime_environment(TrainConfig(mixed_precision="bf16")) == []


def test_runtime_reads_accelerate_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_json(
        tmp_path, {"fp16": {"enabled": True}, "zero_optimization": {"reduce_bucket_size": "big"}}
    )
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(path))
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "deepspeed_config_file,zero3_init_flag,mixed_precision")
    found = [str(p) for p in check_runtime_environment(TrainConfig(mixed_precision="bf16"))]
    assert any(p.startswith("environment: ACCELERATE_MIXED_PRECISION") for p in found)
    assert any("ACCELERATE_CONFIG_DS_FIELDS" in p and "mixed_precision" in p for p in found)
    assert any(p.startswith(f"{path}: fp16.enabled") for p in found)
    assert any("reduce_bucket_size" in p for p in found)
    assert len(found) == 4


def test_runtime_env_overrides_and_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1")
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "1.0")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(tmp_path / "gone.json"))
    found = [str(p) for p in check_runtime_environment(TrainConfig(gradient_accumulation_steps=4))]
    assert len(found) == 2
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS: is 1" in found[0] and "file not found" in found[1]
