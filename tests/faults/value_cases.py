"""Fault cases: values that used to be accepted but wrong, and what --overwrite leaves behind."""

from __future__ import annotations

from pathlib import Path

import yaml
from faults.harness import case, cli, environment, mlp


@case(
    "--overwrite on a directory holding preempted.json, tensorboard/ and wandb/ from the old run",
    "none of them survive: the new run shows only its own curves and markers",
)
def overwrite_leaves_nothing_of_the_old_run(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 2}, log={"tensorboard": True})
    assert cli("train", str(config)).rc == 0
    (run / "preempted.json").write_text("{}")
    (run / "wandb" / "offline-run-old").mkdir(parents=True)
    fresh = cli("train", str(config), "--overwrite", "log.tensorboard=false")
    assert fresh.rc == 0, fresh.err[-2000:]
    left = sorted(p.name for p in run.iterdir() if not p.name.startswith("."))
    assert left == ["config.yaml", "final", "metrics.jsonl"], left
    return f"after --overwrite: {left}"


# --- values that are accepted but wrong --------------------------------------------------------------


@case(
    "output_dir: ~/runs/x, and a path with an unset $VARIABLE",
    "~ becomes the home directory (no directory named '~'); the unset variable is named in an error",
)
def paths_expand_home_and_variables(tmp: Path) -> str:
    config, _ = mlp(tmp, train={"length.steps": 1})
    with environment(HOME=str(tmp / "home")):
        ran = cli("train", str(config), "output_dir=~/runs/x")
    assert ran.rc == 0, ran.err[-2000:]
    assert (tmp / "home" / "runs" / "x" / "final").is_dir() and not any(tmp.rglob("~"))
    unset = cli("train", str(config), "output_dir=$FRAMER_TEST_NOT_SET/x")
    assert unset.rc == 1 and "environment variable FRAMER_TEST_NOT_SET" in unset.err
    return "~/runs/x -> $HOME/runs/x; $FRAMER_TEST_NOT_SET/x -> 'environment variable ... is not set'"


@case(
    "train.length.steps=true, train.micro_batch_size=2.5, log.tensorboard=1",
    "three type errors reported together; none silently coerced (true used to become 1)",
)
def wrong_types_are_errors(tmp: Path) -> str:
    config, _ = mlp(tmp)
    bad = cli(
        "validate", str(config), "train.length.steps=true", "train.micro_batch_size=2.5", "log.tensorboard=1"
    )
    assert bad.rc == 1
    for key in ("train.length.steps", "train.micro_batch_size", "log.tensorboard"):
        assert f"{key}: got" in bad.err, bad.err
    assert "3 problem(s)" in bad.err
    return "exit 1, '3 problem(s)': train.length.steps, train.micro_batch_size, log.tensorboard"


@case(
    "an accelerate YAML with num_processes 0 / 'two', gpu_ids that do not match, machine_rank out of range",
    "`framer-ds validate` names each value and what is allowed",
)
def launch_values_are_checked(tmp: Path) -> str:
    config, _ = mlp(tmp)
    seen = []
    for values, needle in (
        ({"num_processes": 0}, "num_processes: is 0"),
        ({"num_processes": "two"}, "num_processes: is 'two'"),
        ({"num_processes": 4, "gpu_ids": "0,1"}, "gpu_ids: lists 2 GPU(s) but num_processes 4"),
        (
            {"num_machines": 2, "machine_rank": 2, "num_processes": 2},
            "machine_rank: is 2 but num_machines is 2",
        ),
    ):
        accelerate = tmp / "accelerate.yaml"
        accelerate.write_text(yaml.safe_dump({"distributed_type": "MULTI_GPU", **values}))
        checked = cli("validate", str(config), "--accelerate-config", str(accelerate))
        assert checked.rc == 1 and needle in checked.err, (values, checked.err)
        seen.append(needle.split(":")[0])
    return f"refused: {', '.join(seen)}"
