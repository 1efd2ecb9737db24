"""Every config shipped under configs/ loads, starts with a command that really uses it, and agrees
with every shipped launch config (accelerate YAML x DeepSpeed JSON x training YAML)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from framer_ds.cli.main import build_parser, main
from framer_ds.cli.run_commands import LAUNCH_FLAGS
from framer_ds.config.cadence import Cadence
from framer_ds.config.launch_check import check_launch_configs
from framer_ds.launch.environment import hostfile_launch_problems
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _yaml_files() -> list[Path]:
    return sorted(CONFIGS.rglob("*.yaml"))


def _is_training_yaml(path: Path) -> bool:
    """Training YAMLs name a task; accelerate YAMLs never have a top-level `task:` key."""
    data = yaml.safe_load(path.read_text())
    return isinstance(data, dict) and "task" in data


TRAINING_YAMLS = [p for p in _yaml_files() if _is_training_yaml(p)]
ACCELERATE_YAMLS = [p for p in _yaml_files() if not _is_training_yaml(p)]
DEEPSPEED_JSONS = sorted((CONFIGS / "deepspeed").glob("*.json"))
DEEPSPEED_ACCELERATE_YAMLS = [
    p for p in ACCELERATE_YAMLS if str(yaml.safe_load(p.read_text()).get("distributed_type")) == "DEEPSPEED"
]


def _ids(paths: list[Path]) -> list[str]:
    return [_rel(p) for p in paths]


def test_the_shipped_configs_are_found():
    """Guards the globs above: an empty parametrization would silently test nothing."""
    training = set(_ids(TRAINING_YAMLS))
    assert {"configs/quickstart.yaml", "configs/tasks/vit_classification/vit_large_imagenet.yaml"} <= training
    assert {"configs/accelerate_1gpu.yaml", "configs/accelerate_4gpu.yaml"} <= set(_ids(ACCELERATE_YAMLS))
    assert "configs/accelerate_cpu_2proc.yaml" in _ids(DEEPSPEED_ACCELERATE_YAMLS)
    assert len(DEEPSPEED_JSONS) >= 4
    assert training.isdisjoint(_ids(ACCELERATE_YAMLS))


@pytest.mark.parametrize("path", TRAINING_YAMLS, ids=_ids(TRAINING_YAMLS))
def test_training_yaml_loads_without_problems(path):
    config = load_run_config(path)
    assert config.task == path.parent.name or path.name == "quickstart.yaml"


def test_vit_large_imagenet_is_the_documented_fine_tuning_setting():
    config = load_run_config(CONFIGS / "tasks" / "vit_classification" / "vit_large_imagenet.yaml")
    assert config.model.source.path == Path("/data/models/vit-large-patch16-224")
    assert config.model.source.config is None
    assert config.data.source.path == Path("/data/imagenet") and config.data.source.builtin is None
    assert config.data.mean == [0.5] * 3 and config.data.std == [0.5] * 3 and config.data.hflip
    train = config.train
    assert (train.mixed_precision, train.micro_batch_size, train.gradient_accumulation_steps) == (
        "bf16",
        8,
        4,
    )
    assert train.gradient_checkpointing and train.checkpoint.keep_last == 3 and train.num_workers == 8
    schedule, optimizer = train.lr_schedule, train.optimizer
    assert (
        schedule.name == "cosine" and schedule.warmup.fraction > 0 and 1e-5 <= optimizer.learning_rate <= 1e-4
    )
    assert train.eval.every == train.checkpoint.every == Cadence(epochs=0.25)
    assert train.eval.max_batches is None
    assert config.log.wandb is not None and config.log.wandb.project == "framer_ds"
    assert config.log.tensorboard
    # Its paths do not exist on a dev box: the pre-flight check says so, with the download command.
    found = [str(p) for p in get_task_class(config.task)(config).check()]
    if not Path("/data/models/vit-large-patch16-224/config.json").is_file():
        assert any("huggingface-cli download google/vit-large-patch16-224" in p for p in found), found


# --- header commands ------------------------------------------------------------------------------


def _first_line(path: Path) -> str:
    return path.read_text().splitlines()[0]


def _command_of(text: str) -> list[str]:
    """The tokens of a shell command after any leading `VAR=value` environment assignments."""
    tokens = shlex.split(text)
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
        tokens.pop(0)
    return tokens


def _parse_launch(tokens: list[str]) -> tuple[object, list[str]]:
    """Parse `accelerate launch ... -m framer_ds ARGS` with accelerate's own parser; returns
    (accelerate args, framer_ds args) so a typo in a flag fails here, not on the cluster."""
    from accelerate.commands.launch import launch_command_parser

    assert tokens[:2] == ["accelerate", "launch"], tokens
    args = launch_command_parser().parse_args(tokens[2:])
    assert args.module and args.training_script == "framer_ds", tokens
    return args, list(args.training_script_args)


def _assert_config_paths_exist(text: str) -> None:
    for name in re.findall(r"configs/[\w./-]+\.(?:yaml|json)", text):
        assert (REPO / name).is_file(), f"header names {name}, which does not exist"


@pytest.mark.parametrize("path", TRAINING_YAMLS, ids=_ids(TRAINING_YAMLS))
def test_training_yaml_header_is_a_command_that_trains_it(path):
    line = _first_line(path)
    assert line.startswith("#"), line
    assert "framer-ds train" in line or "accelerate launch" in line, line
    assert _rel(path) in line, line
    _assert_config_paths_exist(line)
    tokens = _command_of(line.lstrip("#"))
    if tokens[0] == "framer-ds":
        cli_args = tokens[1:]
    else:
        launch, cli_args = _parse_launch(tokens)
        # DDP (--multi_gpu) needs no accelerate YAML; a YAML it names exists
        assert launch.config_file is None or (REPO / launch.config_file).is_file()
        assert launch.config_file or launch.multi_gpu or launch.num_processes == 1, line
    args = build_parser().parse_args(cli_args)
    assert args.command == "train" and args.config == Path(_rel(path)), line


@pytest.mark.parametrize("path", ACCELERATE_YAMLS, ids=_ids(ACCELERATE_YAMLS))
def test_accelerate_yaml_header_is_a_command_that_uses_it(path):
    line = _first_line(path)
    assert line.startswith("#") and "accelerate launch" in line, line
    _assert_config_paths_exist(line)
    launch, cli_args = _parse_launch(_command_of(line.lstrip("#")))
    assert launch.config_file == _rel(path), line
    assert build_parser().parse_args(cli_args).command == "train"


@pytest.mark.parametrize("path", DEEPSPEED_JSONS, ids=_ids(DEEPSPEED_JSONS))
def test_deepspeed_json_usage_is_a_command_that_uses_it(path):
    usage = json.loads(path.read_text()).get("_usage")
    assert isinstance(usage, str) and "accelerate launch" in usage, usage
    _assert_config_paths_exist(usage)
    launch, cli_args = _parse_launch(_command_of(usage))
    assert launch.deepspeed_config_file == _rel(path), usage
    assert (REPO / launch.config_file).is_file()
    # The JSON is swapped in through a DEEPSPEED accelerate YAML, else accelerate ignores it.
    assert _rel(REPO / launch.config_file) in _ids(DEEPSPEED_ACCELERATE_YAMLS), usage
    assert build_parser().parse_args(cli_args).command == "train"


# --- cross-checks ---------------------------------------------------------------------------------


def lever_refusal(problem) -> bool:
    """A refusal of a plain/DDP-only fit lever (int8 base, 8-bit Adam states) under DeepSpeed or FSDP2."""
    return problem.where == "model.base_precision" or problem.message.startswith(
        ("train.optimizer.name is adamw_8bit", "model.base_precision is")
    )


@pytest.mark.parametrize("train_yaml", TRAINING_YAMLS, ids=_ids(TRAINING_YAMLS))
@pytest.mark.parametrize("accelerate_yaml", ACCELERATE_YAMLS, ids=_ids(ACCELERATE_YAMLS))
def test_training_yaml_agrees_with_accelerate_yaml(train_yaml, accelerate_yaml, monkeypatch):
    """Includes the DeepSpeed JSON each YAML names (paths are relative to the repo root, where you
    launch) and the launch flags its header passes (a multi-node YAML's head node and machine rank).
    No combination conflicts: the accelerate YAMLs leave precision to train.mixed_precision. A recipe
    whose fit levers run plain/DDP only (an int8 base, 8-bit Adam states: the 24 GB SVD-XT one) is refused
    under DeepSpeed and FSDP2 YAMLs for those levers alone (tests/engine/test_base_precision.py)."""
    monkeypatch.chdir(REPO)
    config = load_run_config(train_yaml)
    problems = check_launch_configs(
        config.train,
        Path(_rel(accelerate_yaml)),
        None,
        launch_flags=_header_launch_flags(accelerate_yaml),
        base_precision=config.model.base_precision,
    )
    problems += hostfile_launch_problems(None, Path(_rel(accelerate_yaml)))

    assert [str(p) for p in problems if not lever_refusal(p)] == []


def _header_launch_flags(accelerate_yaml: Path) -> dict:
    """The `accelerate launch` flags the YAML's header command passes, as the YAML keys they beat."""
    launch, _ = _parse_launch(_command_of(_first_line(accelerate_yaml).lstrip("#")))
    flags = {key: getattr(launch, key) for key in LAUNCH_FLAGS}
    return {
        key: int(v) if isinstance(v, str) and v.isdigit() else v for key, v in flags.items() if v is not None
    }


def test_multi_node_yamls_need_the_head_node_from_the_launch():
    """Without --main_process_ip accelerate gives torchrun the string 'None' and every node hangs."""
    found = check_launch_configs(None, Path(_rel(CONFIGS / "accelerate_multinode.yaml")))
    assert [p.where.split(": ")[-1] for p in found] == ["main_process_ip"]


@pytest.mark.parametrize("train_yaml", TRAINING_YAMLS, ids=_ids(TRAINING_YAMLS))
@pytest.mark.parametrize("ds_json", DEEPSPEED_JSONS, ids=_ids(DEEPSPEED_JSONS))
@pytest.mark.parametrize("accelerate_yaml", DEEPSPEED_ACCELERATE_YAMLS, ids=_ids(DEEPSPEED_ACCELERATE_YAMLS))
def test_every_deepspeed_json_swaps_in_cleanly(train_yaml, ds_json, accelerate_yaml, monkeypatch):
    """`--deepspeed_config_file` swaps the ZeRO stage / offload with one flag, as the README says (a
    plain/DDP-only fit lever aside: `lever_refusal`)."""
    monkeypatch.chdir(REPO)
    config = load_run_config(train_yaml)
    problems = check_launch_configs(
        config.train,
        Path(_rel(accelerate_yaml)),
        Path(_rel(ds_json)),
        launch_flags=_header_launch_flags(accelerate_yaml),
        base_precision=config.model.base_precision,
    )
    assert [str(p) for p in problems if not lever_refusal(p)] == []


def test_validate_quickstart_with_cpu_deepspeed_launch_configs(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    rc = main(
        [
            "validate",
            "configs/quickstart.yaml",
            "--accelerate-config",
            "configs/accelerate_cpu_2proc.yaml",
            "--deepspeed-config",
            "configs/deepspeed/zero3.json",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith("OK: configs/quickstart.yaml, configs/accelerate_cpu_2proc.yaml, ")
    assert "configs/deepspeed/zero3.json" in out and err == ""


def test_tts_granite_pretrain_is_the_recipe():
    """micro-batch 2, accumulation 4, 8192 tokens, bf16; its header launches DDP, the plan's pick on
    4 x 80 GB (tests/lab/test_planner.py), and names the recipe's original ZeRO-3 + offload as the swap."""
    path = CONFIGS / "tasks" / "tts_lm" / "granite_1b_pretrain.yaml"
    config = load_run_config(path)
    train, data = config.train, config.data
    assert (train.micro_batch_size, train.gradient_accumulation_steps, train.mixed_precision) == (
        2,
        4,
        "bf16",
    )
    assert data.max_seq_length == 8192 and data.format == "codes" and config.model.lora is None
    assert train.gradient_checkpointing
    header = path.read_text().split("\ntask:")[0]
    assert "--multi_gpu --num_processes 4" in header.splitlines()[0]
    assert "--deepspeed_config_file configs/deepspeed/zero3_offload.json" in header
    sft = load_run_config(CONFIGS / "tasks" / "tts_lm" / "lora_sft.yaml")
    assert sft.model.lora is not None and sft.data.loss_on == "audio" and sft.data.format == "audio"
    assert sft.model.source.path == config.output_dir / "final"
