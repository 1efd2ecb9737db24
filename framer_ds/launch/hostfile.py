"""DeepSpeed hostfiles (`node-a slots=4`, one host a line, `#` comments) and the launcher's
`--include` / `--exclude` filters (`node-a@node-b:0,2`): parsed once, every problem reported at once.

Why our own parser: `scripts/train/launch.sh` and `framer-ds validate --hostfile` must read a hostfile
exactly as DeepSpeed's multi-node launcher will, and fail before a job queues, not at rendezvous.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from framer_ds.config.errors import ConfigError, ConfigProblem

_LINE = re.compile(r"^(?P<host>[A-Za-z0-9_.:\-\[\]]+)\s+slots=(?P<slots>\S+)\s*$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: tuple[int, ...]  # the local device indices (GPUs) to use on it

    @property
    def processes(self) -> int:
        return len(self.slots)


def parse_hostfile(path: Path) -> tuple[list[Host], list[ConfigProblem]]:
    """Hosts in file order, and every problem (bad line, slots not a positive integer, a host twice)."""
    path = Path(path)
    if not path.is_file():
        return [], [ConfigProblem(str(path), "hostfile not found; check the path")]
    hosts: list[Host] = []
    problems: list[ConfigProblem] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        match = _LINE.match(line)
        if match is None:
            problems.append(ConfigProblem(where, f"{line!r} is not 'HOSTNAME slots=N' (e.g. node-a slots=4)"))
            continue
        name, slots = match["host"], match["slots"]
        if not slots.isdigit() or int(slots) < 1:
            problems.append(
                ConfigProblem(where, f"slots={slots} must be a whole number >= 1 (GPUs on {name})")
            )
            continue
        if name in seen:
            problems.append(
                ConfigProblem(where, f"{name} is listed twice (first on line {seen[name]}); keep one line")
            )
            continue
        seen[name] = number
        hosts.append(Host(name, tuple(range(int(slots)))))
    if not hosts and not problems:
        problems.append(ConfigProblem(str(path), "lists no host; add lines like 'node-a slots=4'"))
    return hosts, problems


def _parse_filter(text: str, hosts: dict[str, Host], what: str) -> tuple[dict[str, set[int] | None], list]:
    """`node-a@node-b:0,2` -> {node-a: None (all slots), node-b: {0, 2}}."""
    chosen: dict[str, set[int] | None] = {}
    problems = []
    for part in filter(None, text.split("@")):
        name, _, slot_text = part.partition(":")
        if name not in hosts:
            problems.append(
                ConfigProblem(f"--{what}", f"host {name!r} is not in the hostfile ({', '.join(hosts)})")
            )
            continue
        if not slot_text:
            chosen[name] = None
            continue
        try:
            slots = {int(s) for s in slot_text.split(",")}
        except ValueError:
            problems.append(ConfigProblem(f"--{what}", f"{part!r}: slots must be comma-separated integers"))
            continue
        unknown = sorted(slots - set(hosts[name].slots))
        if unknown:
            problems.append(
                ConfigProblem(
                    f"--{what}", f"{name} has slots {list(hosts[name].slots)}; {unknown} do not exist"
                )
            )
        chosen[name] = slots
    return chosen, problems


def select_hosts(
    hosts: list[Host], include: str | None = None, exclude: str | None = None
) -> tuple[list[Host], list]:
    """DeepSpeed's include/exclude semantics: include keeps only what it names, exclude drops it; not both."""
    problems: list[ConfigProblem] = []
    if include and exclude:
        return hosts, [
            ConfigProblem("--include/--exclude", "give one of them, not both (as DeepSpeed's launcher)")
        ]
    by_name = {h.name: h for h in hosts}
    if include:
        chosen, problems = _parse_filter(include, by_name, "include")
        selected = [
            Host(h.name, tuple(s for s in h.slots if chosen[h.name] is None or s in chosen[h.name]))
            for h in hosts
            if h.name in chosen
        ]
    elif exclude:
        dropped, problems = _parse_filter(exclude, by_name, "exclude")
        selected = []
        for host in hosts:
            if host.name in dropped and dropped[host.name] is None:
                continue  # the whole host
            gone = dropped.get(host.name) or set()
            selected.append(Host(host.name, tuple(s for s in host.slots if s not in gone)))
    else:
        selected = list(hosts)
    selected = [h for h in selected if h.slots]
    if not selected and not problems:
        problems.append(ConfigProblem("--include/--exclude", "no host and slot is left to run on"))
    return selected, problems


def load_hosts(
    path: Path,
    include: str | None = None,
    exclude: str | None = None,
    num_gpus: int | None = None,
    same_slots: bool = False,
) -> list[Host]:
    """The hosts a launch will use, or a ConfigError listing every problem. `num_gpus` keeps the first N
    slots of each host (DeepSpeed's --num_gpus); `same_slots` requires one process count on every host,
    as accelerate starts the same number on each machine."""
    hosts, problems = parse_hostfile(path)
    if not problems:
        hosts, problems = select_hosts(hosts, include, exclude)
    if not problems and num_gpus is not None:
        if num_gpus < 1:
            problems.append(ConfigProblem("NUM_GPUS", f"is {num_gpus}; it must be >= 1"))
        hosts = [Host(h.name, h.slots[:num_gpus]) for h in hosts]
    if not problems and same_slots:
        problems += _unequal_slots(hosts, str(path))
    if problems:
        raise ConfigError(problems, str(path))
    return hosts


def _unequal_slots(hosts: list[Host], where: str) -> list[ConfigProblem]:
    if len({h.processes for h in hosts}) <= 1:
        return []
    per_host = ", ".join(f"{h.name}: {h.processes}" for h in hosts)
    msg = (
        f"hosts would run different numbers of processes ({per_host}); accelerate starts the same number "
        "on each machine: give every host the same slots, or cap them with NUM_GPUS / --include"
    )
    return [ConfigProblem(where, msg)]


def hostfile_problems(
    path: Path,
    num_processes: int | None,
    num_machines: int | None,
    include: str | None = None,
    exclude: str | None = None,
) -> list[ConfigProblem]:
    """For `framer-ds validate --hostfile`: the file, the include/exclude filter, and whether the
    accelerate YAML's counts match the hosts and slots left after filtering."""
    hosts, problems = parse_hostfile(path)
    if not problems and hosts:
        hosts, problems = select_hosts(hosts, include, exclude)
    if problems or not hosts:
        return problems
    total = sum(h.processes for h in hosts)
    if num_machines is not None and num_machines != len(hosts):
        problems.append(
            ConfigProblem(
                "num_machines", f"is {num_machines} but {path} lists {len(hosts)} hosts; make them agree"
            )
        )
    if num_processes is not None and num_processes != total:
        per_host = ", ".join(f"{h.name}: {h.processes}" for h in hosts)
        problems.append(
            ConfigProblem(
                "num_processes",
                f"is {num_processes} but {path} gives {total} slots ({per_host}); num_processes is the total "
                "over all machines",
            )
        )
    return problems + _unequal_slots(hosts, str(path))
