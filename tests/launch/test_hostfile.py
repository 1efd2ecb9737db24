"""Hostfiles, include/exclude filters and the launch checks of `framer-ds validate`: every problem of a
multi-node launch reported at once, before it queues."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from framer_ds.cli.main import main
from framer_ds.config.errors import ConfigError
from framer_ds.launch.environment import use_deepspeed_json
from framer_ds.launch.hostfile import Host, load_hosts, parse_hostfile, select_hosts

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "hostfile") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_parse_reads_hosts_in_order_and_skips_comments(tmp_path):
    hosts, problems = parse_hostfile(
        write(tmp_path, "# head first\nnode-a slots=4  # big\n\nnode-b slots=2\n")
    )
    assert problems == []
    assert hosts == [Host("node-a", (0, 1, 2, 3)), Host("node-b", (0, 1))]


def test_every_problem_of_a_hostfile_at_once(tmp_path):
    path = write(tmp_path, "node-a slots=4\nnode-b slots=zero\nnode-a slots=4\nnode-c\nnode-d slots=0\n")
    _, problems = parse_hostfile(path)
    text = [str(p) for p in problems]
    assert len(text) == 4, text
    assert "hostfile:2" in text[0] and "slots=zero" in text[0]
    assert "hostfile:3" in text[1] and "listed twice (first on line 1)" in text[1]
    assert "hostfile:4" in text[2] and "HOSTNAME slots=N" in text[2]
    assert "hostfile:5" in text[3] and ">= 1" in text[3]


def test_missing_and_empty_hostfiles(tmp_path):
    assert "not found" in str(parse_hostfile(tmp_path / "nope")[1][0])
    assert "lists no host" in str(parse_hostfile(write(tmp_path, "# nothing\n"))[1][0])


HOSTS = [Host("node-a", (0, 1, 2, 3)), Host("node-b", (0, 1, 2, 3)), Host("node-c", (0, 1, 2, 3))]


@pytest.mark.parametrize(
    ("include", "exclude", "expected"),
    [
        ("node-a@node-b:0,2", None, [Host("node-a", (0, 1, 2, 3)), Host("node-b", (0, 2))]),
        (None, "node-c", HOSTS[:2]),
        (None, "node-b:1", [HOSTS[0], Host("node-b", (0, 2, 3)), HOSTS[2]]),
    ],
)
def test_include_exclude_as_deepspeed(include, exclude, expected):
    assert select_hosts(HOSTS, include, exclude) == (expected, [])


def test_filter_problems_name_the_fix():
    _, both = select_hosts(HOSTS, "node-a", "node-b")
    assert "not both" in str(both[0])
    _, unknown = select_hosts(HOSTS, "node-z@node-a:7", None)
    assert "'node-z' is not in the hostfile" in str(unknown[0]) and "[7] do not exist" in str(unknown[1])
    _, nothing = select_hosts(HOSTS, None, "node-a@node-b@node-c")
    assert "no host and slot is left" in str(nothing[0])


def test_load_hosts_caps_slots_and_requires_the_same_count(tmp_path):
    path = write(tmp_path, "node-a slots=4\nnode-b slots=2\n")
    assert [h.slots for h in load_hosts(path, num_gpus=2, same_slots=True)] == [(0, 1), (0, 1)]
    with pytest.raises(ConfigError, match="node-a: 4, node-b: 2"):
        load_hosts(path, same_slots=True)


def test_hosts_command_prints_machine_ranks(tmp_path, capsys):
    path = write(tmp_path, "node-a slots=2\nnode-b slots=2\n")
    assert main(["hosts", str(path), "--exclude", "node-a:1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["0 node-a 0", "1 node-b 0,1"]


def _validate(capsys, *args: str) -> list[str]:
    """The problems `framer-ds validate` prints (it exits non-zero with all of them)."""
    assert main(["validate", "configs/quickstart.yaml", *args]) != 0
    return [line[4:] for line in capsys.readouterr().err.splitlines() if line.startswith("  - ")]


def test_validate_reports_every_launch_problem_at_once(tmp_path, monkeypatch, capsys):
    """Counts against the hostfile, a non-numeric port, a missing JSON, a key accelerate rejects next to a
    JSON, and a multi-node launch without the head node: one run of validate, each with its fix."""
    monkeypatch.chdir(REPO)
    acc = yaml.safe_load((REPO / "configs/accelerate_multinode.yaml").read_text())
    acc["mixed_precision"] = "bf16"
    acc_path = tmp_path / "acc.yaml"
    acc_path.write_text(yaml.safe_dump(acc))
    hostfile = write(tmp_path, "node-a slots=4\nnode-b slots=4\nnode-b slots=4\n")
    found = _validate(
        capsys,
        "--accelerate-config",
        str(acc_path),
        "--deepspeed-config",
        "configs/deepspeed/zero9.json",
        "--hostfile",
        str(hostfile),
        "--num-processes",
        "7",
        "--main-process-port",
        "29x00",
    )
    joined = "\n".join(found)
    assert "main_process_port: is '29x00'" in joined
    assert "num_processes: 7 does not split evenly" in joined
    assert "main_process_ip: is missing but num_machines is 2" in joined
    assert "mixed_precision" in joined and "zero9.json" in joined
    assert "listed twice" in joined


def test_validate_checks_counts_against_the_hostfile(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    hostfile = write(tmp_path, "node-a slots=4\nnode-b slots=4\nnode-c slots=4\n")
    found = _validate(
        capsys, "--accelerate-config", "configs/accelerate_hostfile.yaml", "--hostfile", str(hostfile)
    )
    assert any("num_machines: is 2 but" in p and "lists 3 hosts" in p for p in found), found
    assert any("num_processes: is 8 but" in p and "gives 12 slots" in p for p in found), found


def test_validate_reads_the_yaml_hostfile_of_deepspeeds_runner(tmp_path, monkeypatch, capsys):
    """accelerate_hostfile.yaml names configs/hostfile.example (2 x 4 = its 8 processes): clean. A YAML
    that hands a multi-node launch to DeepSpeed's runner without a hostfile says both ways out."""
    monkeypatch.chdir(REPO)
    assert (
        main(
            ["validate", "configs/quickstart.yaml", "--accelerate-config", "configs/accelerate_hostfile.yaml"]
        )
        == 0
    )
    assert "OK" in capsys.readouterr().out
    found = _validate(
        capsys,
        "--accelerate-config",
        "configs/accelerate_4gpu.yaml",
        "--num-machines",
        "2",
        "--num-processes",
        "8",
    )
    assert len(found) == 1 and "deepspeed_hostfile: is missing" in found[0]
    assert "deepspeed_multinode_launcher: standard" in found[0]


def test_config_get_prints_one_resolved_value(capsys, tmp_path):
    assert main(["config", "get", "output_dir", "configs/quickstart.yaml", f"output_dir={tmp_path}"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path)
    assert main(["config", "get", "train.micro_batchsize", "configs/quickstart.yaml"]) != 0
    assert "Did you mean 'micro_batch_size'" in capsys.readouterr().err


def test_deepspeed_config_flag_sets_what_accelerate_launch_sets(monkeypatch, tmp_path):
    # A private environment: the variables must not leak into later in-process runs.
    monkeypatch.setattr(
        os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    )
    with pytest.raises(ConfigError, match="not found"):
        use_deepspeed_json(tmp_path / "zero9.json")
    use_deepspeed_json(REPO / "configs/deepspeed/zero3.json")
    assert os.environ["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert os.environ["ACCELERATE_DEEPSPEED_CONFIG_FILE"].endswith("zero3.json")
    # Under accelerate launch (which already set it) the flag would be a second, conflicting source.
    with pytest.raises(ConfigError, match="drop --deepspeed-config"):
        use_deepspeed_json(REPO / "configs/deepspeed/zero2.json")


def test_smoke_test_names_an_unresolvable_head_at_once(monkeypatch):
    """The backend would retry the name until its timeout and then report only a timeout."""
    from framer_ds.launch.smoke import SmokeTestFailed, hint_for, run_smoke_test

    for name, value in {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "node-zz.invalid",
        "MASTER_PORT": "29999",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SmokeTestFailed, match="MASTER_ADDR does not resolve"):
        run_smoke_test(timeout_s=60)
    assert "MASTER_PORT is taken" in hint_for("EADDRINUSE, message: address already in use")
    assert "NCCL_SOCKET_IFNAME" in hint_for("NCCL error: unhandled system error")


def test_validate_applies_the_yaml_include_filter_before_counting(tmp_path, monkeypatch, capsys):
    """accelerate passes deepspeed_inclusion_filter to DeepSpeed's runner: the counts are of what is left,
    and a filter naming an unknown host or slot is reported."""
    monkeypatch.chdir(REPO)
    acc = yaml.safe_load((REPO / "configs/accelerate_hostfile.yaml").read_text())
    hostfile = write(tmp_path, "node-a slots=4\nnode-b slots=4\nnode-c slots=4\n")
    acc["deepspeed_config"] |= {
        "deepspeed_hostfile": str(hostfile),
        "deepspeed_inclusion_filter": "node-a@node-c",
    }
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(acc))
    assert (
        main(["validate", "configs/quickstart.yaml", "--accelerate-config", str(tmp_path / "acc.yaml")]) == 0
    )
    acc["deepspeed_config"]["deepspeed_inclusion_filter"] = "node-a@node-z:9"
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(acc))
    found = _validate(capsys, "--accelerate-config", str(tmp_path / "acc.yaml"))
    assert len(found) == 1 and "'node-z' is not in the hostfile" in found[0]
