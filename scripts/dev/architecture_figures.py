"""The figures issue 32 asks for, computed from the code instead of counted by hand.

    python scripts/dev/architecture_figures.py

- Task's members: the public names the `Task` class defines (methods, properties, class attributes),
  the protocol every task implements or inherits; the lab's optional planning hooks are counted apart.
- Lines in shared layers used by one task: every module under `framer_ds/data/` (the layer tasks share)
  whose importers, directly or not, are tasks of exactly one task package; such code belongs in that
  task's folder. Imports are read by grimp (import-linter's graph), lazy ones included.
- The largest modules and functions (style: modules under ~400 lines, functions under ~80).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "framer_ds"
SHARED_LAYERS = ("framer_ds.data", "framer_ds.diffusion")  # diffusion/ existed until issue 32


def public_members(cls: type) -> list[str]:
    """Names defined on the class itself, declared-only attributes (`name: str`) included."""
    names = set(vars(cls)) | set(vars(cls).get("__annotations__", {}))
    return sorted(name for name in names if not name.startswith("_"))


def task_members() -> dict[str, list[str]]:
    base = importlib.import_module("framer_ds.tasks.base")
    members = {"Task": public_members(base.Task)}
    try:
        planning = importlib.import_module("framer_ds.tasks.planning")
    except ModuleNotFoundError:
        return members
    for name, obj in vars(planning).items():
        if inspect.isclass(obj) and obj.__module__ == planning.__name__ and not name.startswith("_"):
            members[name] = public_members(obj)
    return members


def task_packages_importing(graph: grimp.ImportGraph, module: str) -> set[str]:
    """The built-in tasks whose modules import `module`, directly or through other modules."""
    from framer_ds.tasks.registry import BUILTIN_TASKS

    tasks = set()
    for importer in graph.find_downstream_modules(module):
        parts = importer.split(".")
        if parts[:2] == ["framer_ds", "tasks"] and len(parts) > 2 and parts[2] in BUILTIN_TASKS:
            tasks.add(parts[2])
    return tasks


def module_lines(module: str) -> int:
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.is_file():
        path = path.with_suffix("") / "__init__.py"
    return len(path.read_text().splitlines())


def one_task_shared_modules(graph: grimp.ImportGraph) -> list[tuple[str, str, int]]:
    found = []
    for module in sorted(graph.modules):
        if not module.startswith(tuple(f"{layer}." for layer in SHARED_LAYERS)):
            continue
        tasks = task_packages_importing(graph, module)
        if len(tasks) == 1:
            found.append((module, tasks.pop(), module_lines(module)))
    return found


def largest(limit_module: int = 400, limit_function: int = 80) -> tuple[list[str], list[str]]:
    modules, functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        name = str(path.relative_to(REPO))
        if lines > limit_module:
            modules.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > limit_function:
                    functions.append(f"{name}:{node.name}: {length} lines")
    return modules, functions


def main() -> None:
    for owner, names in task_members().items():
        print(f"{owner}: {len(names)} members: {', '.join(names)}")
    graph = grimp.build_graph("framer_ds", cache_dir=None)
    single = one_task_shared_modules(graph)
    print(f"lines in shared layers used by one task: {sum(n for *_, n in single)}")
    for module, task, lines in single:
        print(f"  {module} ({lines} lines): only {task}")
    modules, functions = largest()
    print(f"modules over 400 lines: {len(modules)}", *modules, sep="\n  ")
    print(f"functions over 80 lines: {len(functions)}", *functions, sep="\n  ")


if __name__ == "__main__":
    main()
