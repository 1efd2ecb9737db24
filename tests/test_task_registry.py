"""The registry imports only the task a run names: the built-in task modules pull in transformers,
diffusers, peft and their models, ~5-10 s of CPU that every process of every launch used to pay."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO
from framer_ds.tasks.registry import _TASKS, BUILTIN_TASKS, available_tasks


def test_every_builtin_task_is_registered_by_the_module_the_map_names():
    available_tasks()  # imports every built-in module
    ours = {name: cls.__module__ for name, cls in _TASKS.items() if cls.__module__.startswith("framer_ds.")}
    assert ours == BUILTIN_TASKS


def test_a_run_imports_only_its_own_task():
    code = (
        "import sys\n"
        "from framer_ds.tasks.registry import get_task_class\n"
        "from framer_ds.tasks.run_config import load_run_config\n"
        "import framer_ds.train.loop\n"
        "config = load_run_config('configs/quickstart.yaml')\n"
        "get_task_class(config.task)(config)\n"
        "print(sorted(m for m in ('diffusers', 'peft', 'snac') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.split()[-1] == "[]", done.stdout
