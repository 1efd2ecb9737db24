"""What keeps the code base readable as tasks are added: imports point down the layers, the generated
config reference is current, and citations point inside the repository. That every config key of every
task is described is part of the task contract suite (tests/tasks/test_task_contract.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from framer_ds.tasks.config_docs import builtin_task_names, config_docs_markdown


def test_imports_point_down_the_layers():
    """`lint-imports` with the contract in pyproject.toml (cli -> lab -> launch -> train -> tasks -> engine |
    data -> config -> storage; the four built-in tasks independent of one another); a violation prints
    the offending import chain."""
    lint_imports = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint_imports)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


# Modules that imported each other, one of them lazily (inside a function or under TYPE_CHECKING): a lazy
# import hides the cycle from a reader and from the layers contract, which sees only imports between
# layers (issue 32). grimp, import-linter's graph, counts lazy imports too.
FORMER_CYCLES = [
    (
        "framer_ds.tasks.video_lora.framer.tracks.point_tracks",
        "framer_ds.tasks.video_lora.framer.tracks.cotracker",
    ),
    ("framer_ds.lab.bench", "framer_ds.lab.bench_plots"),
    # Task's refusing CLI hooks imported the registry, which imports base (the hooks are gone).
    ("framer_ds.tasks.base", "framer_ds.tasks.registry"),
    # loader's lazy import of schema.expand_path closed cadence -> loader -> schema -> train_config (issue 46)
    ("framer_ds.config.loader", "framer_ds.config.schema"),
]


def import_cycles(graph) -> list[list[str]]:
    """Every set of framer_ds modules that import one another in a circle (the strongly connected
    components of more than one module, Tarjan's algorithm, iterative), lazy and TYPE_CHECKING imports
    included: grimp records every import statement wherever it stands."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges.get(target, ()))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_framer_ds_has_no_import_cycle():
    """No module of framer_ds reaches itself through its imports (issue 46: video_lora's inference ->
    framer_inference -> framer_export -> export_formats -> inference, and config's cadence -> loader ->
    schema -> train_config -> cadence, both closed by lazy imports). The `acyclic_siblings` contract in
    pyproject.toml keeps packages apart at every depth; this also catches a module and its own package."""
    import grimp

    assert import_cycles(grimp.build_graph("framer_ds", cache_dir=None)) == []


@pytest.mark.parametrize(("first", "second"), FORMER_CYCLES)
def test_former_cycles_import_one_way(first, second):
    import grimp

    graph = grimp.build_graph("framer_ds", cache_dir=None)
    forward = graph.find_shortest_chain(importer=first, imported=second)
    backward = graph.find_shortest_chain(importer=second, imported=first)
    assert forward is None or backward is None, f"import cycle: {forward} and {backward}"


def test_engine_binds_no_allocation_counter():
    """The engine's metrics once bound the lab's LD_PRELOAD counter through `ctypes.CDLL(None)`, an
    engine -> lab dependency no contract could see (issue 32); the lab now hands its figures to
    `engine.metrics.add_memory_probe`, and no engine module imports ctypes."""
    import grimp

    graph = grimp.build_graph("framer_ds", include_external_packages=True, cache_dir=None)
    binders = sorted(
        m for m in graph.find_modules_that_directly_import("ctypes") if m.startswith("framer_ds.engine")
    )
    assert binders == []


def test_the_builtin_tasks_are_all_documented():
    """docs/config.md documents exactly the registry's built-in tasks (not a test or user task)."""
    from framer_ds.tasks.registry import BUILTIN_TASKS

    assert builtin_task_names() == sorted(BUILTIN_TASKS)


def test_docs_config_md_is_current():
    written = (REPO / "docs" / "config.md").read_text()
    assert written == config_docs_markdown(), (
        "docs/config.md is stale: run `framer-ds config docs --write docs/config.md`"
    )


def test_citations_point_inside_the_repository():
    """Code, docs and tests cited a DESIGN.md that is not in the repository; docs/architecture.md is."""
    assert (REPO / "docs" / "architecture.md").is_file()
    offenders = [
        str(path.relative_to(REPO))
        for folder in ("framer_ds", "tests", "docs", "benchmarks", "scripts", "configs")
        for path in (REPO / folder).rglob("*")
        if path.is_file()
        and path.suffix in {".py", ".md", ".yaml", ".json", ".sh"}
        and path.name != Path(__file__).name
        and "DESIGN.md" in path.read_text(errors="ignore")
    ]
    assert not offenders, f"these cite DESIGN.md; cite docs/architecture.md instead: {offenders}"


def test_the_minimal_task_in_architecture_md_trains(tmp_path, monkeypatch):
    """The documented example is complete: copied out of the doc, it registers, trains and exports."""
    import re

    import yaml

    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.train.loop import run_training

    doc = (REPO / "docs" / "architecture.md").read_text()
    code = re.search(r"## The Task protocol.*?```python\n(.*?)```", doc, flags=re.S).group(1)
    (tmp_path / "my_tasks.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = {
        "imports": ["my_tasks"],
        "task": "sine",
        "output_dir": str(tmp_path / "run"),
        "data": {},
        "train": {
            "length": {"steps": 60},
            "micro_batch_size": 32,
            "optimizer": {"learning_rate": 1e-2},
            "eval": {"every": {"steps": 30}},
        },
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    result = run_training(load_run_config(tmp_path / "c.yaml"))
    assert result.eval_metrics["eval/mse"] < 0.1
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_shell_scripts_pass_shellcheck():
    """The launch scripts users sbatch or run (and CI's own entry point)."""
    scripts = sorted(
        str(p) for p in (*REPO.glob("slurm/*.sh"), *REPO.glob("scripts/**/*.sh"), REPO / ".ci" / "run")
    )
    shellcheck = Path(sys.executable).parent / "shellcheck"
    proc = subprocess.run(
        [str(shellcheck), "-x", *scripts], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
