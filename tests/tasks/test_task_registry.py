"""The registry imports only the task a run names: the built-in task modules pull in transformers,
diffusers, peft and their models, ~5-10 s of CPU that every process of every launch used to pay. The
commands tasks contribute to the CLI are read from light declarations, so building the parser (every
`framer-ds` process does) imports no task."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO
from framer_ds.tasks.registry import _TASKS, BUILTIN_TASKS, available_tasks

HEAVY = ("diffusers", "peft", "snac")


def imported_after(code: str) -> list[str]:
    """Run `code` in a fresh interpreter; which of HEAVY and the built-in task modules it imported."""
    watched = (*HEAVY, *BUILTIN_TASKS.values())
    report = f"import json, sys\nprint(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", code + report], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_every_builtin_task_is_registered_by_the_module_the_map_names():
    available_tasks()  # imports every built-in module
    ours = {name: cls.__module__ for name, cls in _TASKS.items() if cls.__module__.startswith("framer_ds.")}
    assert ours == BUILTIN_TASKS


def test_a_run_imports_only_its_own_task():
    code = (
        "from framer_ds.tasks.registry import get_task_class\n"
        "from framer_ds.tasks.run_config import load_run_config\n"
        "import framer_ds.train.loop\n"
        "config = load_run_config('configs/quickstart.yaml')\n"
        "get_task_class(config.task)(config)\n"
    )
    assert imported_after(code) == ["framer_ds.tasks.vit_classification.task"]


def test_validate_through_the_cli_imports_only_its_own_task():
    """`framer-ds validate` builds the whole parser, task-contributed commands included."""
    code = "from framer_ds.cli.main import main\nassert main(['validate', 'configs/quickstart.yaml']) == 0\n"
    assert imported_after(code) == ["framer_ds.tasks.vit_classification.task"]


def test_building_the_parser_imports_no_task():
    code = "from framer_ds.cli.main import build_parser\nbuild_parser()\n"
    assert imported_after(code) == []


def test_data_offers_check_and_the_commands_tasks_declare():
    """The CLI knows no task's verbs: `framer-ds data` lists what the tasks' declarations name, each
    declared by a built-in task, and the Task protocol keeps no hook that only one task implements."""
    from framer_ds.cli.main import build_parser
    from framer_ds.tasks.base import Task
    from framer_ds.tasks.registry import BUILTIN_TASK_COMMANDS, task_commands

    parser = build_parser()
    data = parser._subparsers._group_actions[0].choices["data"]
    offered = list(data._subparsers._group_actions[0].choices)
    assert offered == ["check", "encode-audio", "tracks"]
    assert {name: list(tasks) for name, tasks in task_commands().items()} == {
        "encode-audio": ["tts_lm"],
        "tracks": ["video_lora"],
    }
    assert set(BUILTIN_TASK_COMMANDS) <= set(BUILTIN_TASKS)
    assert not hasattr(Task, "encode_data") and not hasattr(Task, "compute_tracks")


def test_an_installed_package_contributes_commands_through_an_entry_point(tmp_path, monkeypatch, capsys):
    """A task outside framer_ds adds `framer-ds data` commands by naming its commands module in the
    entry-point group `framer_ds.task_commands` (its pyproject.toml); before, only the built-in
    tasks' modules (BUILTIN_TASK_COMMANDS) were read."""
    from importlib.metadata import EntryPoint

    from conftest import mlp_config
    from framer_ds.cli.main import main
    from framer_ds.tasks import registry

    declared = [EntryPoint("test_mlp_regression", "framer_test_tasks", registry.TASK_COMMANDS_GROUP)]
    monkeypatch.setattr(
        registry, "entry_points", lambda group: declared if group == registry.TASK_COMMANDS_GROUP else []
    )
    assert list(registry.task_commands()["count-samples"]) == ["test_mlp_regression"]
    config = mlp_config(tmp_path / "config.yaml", tmp_path / "run")
    assert main(["data", "count-samples", str(config)]) == 0
    assert capsys.readouterr().out.strip().endswith("512 training samples")
