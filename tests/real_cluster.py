"""A real two-node cluster for the launch tests: Slurm (slurmctld, a slurmd per node), an sshd per node,
pdsh and munge, built by `scripts/dev/cluster.sh` (each node a network + UTS + PID + mount namespace on
a bridge; docs/cluster.md, "Rehearse a multi-node launch on one machine").

`cluster` is built once per pytest session where this machine can (root, `ip netns`, Debian's
`slurmctld slurmd slurm-client munge pdsh openssh-server`, which `.ci/run` installs), and skipped with
the reason where it cannot. It is torn down (daemons by recorded PID, namespaces, the /etc/hosts and ssh
blocks) when the session ends, a failed test included. Its tests live in ONE file
(tests/launch/test_cluster.py): the suite runs each file on one xdist worker, and a second worker
building the same namespaces would tear down the first one's. A lock file keeps two pytest sessions on
one machine from doing that too.

Cost (2026-11-28, the shared 2-core machine): the cluster up in ~2 s and down in ~4 s; the seven tests
443 CPU-seconds (ranks, launchers and daemons, measured in a cpuacct cgroup) and 12 min of wall time,
most of it waits on Slurm (a requeued job's 10 s hold, a 32 s checkpoint, SlurmdTimeout).

The launches run in a scratch copy of the checkout (`conftest.scratch_copy`: what a fresh clone holds),
so what they leave (logs/, runs/, .deepspeed_env) is a fresh clone's, not this checkout's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO, scratch_copy

SCRIPT = REPO / "scripts" / "dev" / "cluster.sh"
NODES = ("fds-node1", "fds-node2")
LOCK = Path("/tmp/framer_ds_cluster.lock")
REQUIRED_ENV = "FRAMER_DS_REQUIRE_CLUSTER"
"""Set to 1 (`.ci/run` does): a cluster that cannot be built fails the cluster tests instead of skipping
them, so a green CI run is proof that they ran (a skip leaves no trace in a passing run's log)."""
LOCK_WAIT_S = 900
# A job in one of these states is over (while its processes are being killed it is COMPLETING).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")


@dataclass
class Cluster:
    directory: Path  # CLUSTER_DIR: configs, logs
    checkout: Path  # the scratch copy every launch runs in
    env: dict[str, str]  # SLURM_CONF, the venv first on PATH, PYTHONPATH for the test tasks

    started: list[subprocess.Popen] = field(default_factory=list, repr=False)  # by `start`; see `clean_up`

    def run(
        self, cmd: list[str], timeout: float = 300, drop: tuple[str, ...] = (), **env: str
    ) -> subprocess.CompletedProcess:
        """CMD in the checkout with the cluster's environment, plus `env`, less the names in `drop`. On
        `timeout` its whole process group is killed: subprocess.run would kill only CMD and then wait
        for the pdsh / ssh clients under it, which hold its output pipes open."""
        env = {k: v for k, v in {**self.env, **env}.items() if k not in drop}
        with subprocess.Popen(
            cmd,
            cwd=self.checkout,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                out, err = proc.communicate()
                raise AssertionError(
                    f"{cmd[:4]} did not end in {timeout} s:\n{out[-3000:]}\n{err[-3000:]}"
                ) from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def start(self, cmd: list[str], **env: str) -> subprocess.Popen:
        """A launch left running, in its own session (a terminal's process group), output merged, with
        SIGINT and SIGQUIT at their defaults as a terminal's shell starts a command: a suite started in the
        background (`make test &`, a CI runner's job) hands its children SIGINT ignored, and bash cannot
        trap a signal that was ignored when it started, so launch.sh never saw the test's Ctrl-C and
        its run trained to the end (`env --default-signal`, GNU coreutils 8.31+)."""
        proc = subprocess.Popen(
            ["env", "--default-signal=INT,QUIT", *cmd],
            cwd=self.checkout,
            env={**self.env, **env},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started.append(proc)
        return proc

    def sbatch(self, *args: str, drop: tuple[str, ...] = (), **env: str) -> str:
        """The job id of `sbatch ARGS` (its --export=ALL,... passes this environment on)."""
        proc = self.run(["sbatch", "--parsable", *args], timeout=30, drop=drop, **env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as {key: value}; {} once Slurm has forgotten it."""
        proc = self.run(["scontrol", "show", "job", "-o", job_id], timeout=30)
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout)) if proc.returncode == 0 else {}

    def log(self, job_id: str) -> str:
        """The job's output file (#SBATCH --output=logs/%x-%j.out), every restart appended."""
        found = list((self.checkout / "logs").glob(f"*-{job_id}.out"))
        return found[0].read_text(errors="replace") if found else ""

    def wait_job(
        self, job_id: str, until: Callable[[dict[str, str]], bool] | None = None, timeout: float = 600
    ) -> dict[str, str]:
        """Until `until(job)` (default: the job has ended); fails with its log after `timeout` s."""
        until = until or (lambda job: job.get("JobState") in ENDED)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if until(job):
                return job
            time.sleep(0.5)
        raise AssertionError(
            f"job {job_id} not there in {timeout} s: {self.job(job_id)}\n{self.log(job_id)[-4000:]}"
        )

    def clean_up(self, timeout: float = 60) -> str:
        """What a test leaves must not reach the next one: its jobs are cancelled and waited for (they
        would hold the nodes), the launches it started here are killed with their process groups, and
        what those left on the nodes (ranks started over ssh or pdsh) is stopped, by PID
        (`cluster.sh clean-nodes`). Returns what was cleaned, empty after a test that left nothing."""
        done = []
        if self.run(["squeue", "-h"], timeout=30).stdout.strip():
            done.append("cancelled the jobs left: " + self.run(["squeue", "-h"], timeout=30).stdout.strip())
            self.run(["scancel", f"--user={os.getuid()}"], timeout=30)
            deadline = time.monotonic() + timeout
            while self.run(["squeue", "-h"], timeout=30).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        for proc in self.started:
            if proc.poll() is None:
                done.append(f"killed the launch {proc.args[:3]} left running")
                _kill_group(proc)
            proc.communicate()
        self.started.clear()
        return "\n".join([*done, self.script("clean-nodes")]).strip()

    def hostfile(self, *hosts: str) -> Path:
        path = self.directory / ("hostfile_" + "_".join(hosts))
        path.write_text("".join(f"{host} slots=1\n" for host in hosts))
        return path

    def script(self, *args: str) -> str:
        """scripts/dev/cluster.sh ARGS (crash-node NODE, boot-node NODE, clean-nodes): its output."""
        proc = subprocess.run(
            ["bash", str(SCRIPT), *args], env=self.script_env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return (proc.stdout + proc.stderr).strip()

    @property
    def script_env(self) -> dict[str, str]:
        return {**os.environ, "CLUSTER_DIR": str(self.directory)}

    def daemon_logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:])
            for path in sorted((self.directory / "log").glob("*.log"))
        )


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group `proc` leads (it was started in a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _why_not() -> str | None:
    if not SCRIPT.is_file():
        return f"{SCRIPT} is missing"
    proc = subprocess.run(["bash", str(SCRIPT), "check"], capture_output=True, text=True, timeout=60)
    return (
        None
        if proc.returncode == 0
        else f"no real cluster here: {proc.stdout.strip() or proc.stderr.strip()}"
    )


def _skip(why: str) -> None:
    """Skip with `why`, or fail with it where REQUIRED_ENV asks for the cluster."""
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{why} ({REQUIRED_ENV}=1: the cluster tests must run here)", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The two-node cluster, up for the whole session (see the module docstring)."""
    why = _why_not()
    if why:
        _skip(why)
    LOCK.touch(exist_ok=True)
    with LOCK.open() as lock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    _skip(f"another pytest session has held the cluster ({LOCK}) for {LOCK_WAIT_S} s")
                time.sleep(2)
        root = tmp_path_factory.mktemp("cluster")
        made = Cluster(root / "cluster", scratch_copy(root / "checkout"), {})
        made.directory.mkdir()
        made.env = {
            **os.environ,
            "SLURM_CONF": str(made.directory / "etc" / "slurm.conf"),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(made.checkout / "tests"),
        }
        try:
            up = subprocess.run(
                ["bash", str(SCRIPT), "up"], env=made.script_env, capture_output=True, text=True, timeout=180
            )
            if up.returncode == 3:  # another cluster is up on this machine (its names are the machine's)
                _skip(f"no real cluster here: {up.stderr.strip()}")
            assert up.returncode == 0, f"cluster.sh up failed:\n{up.stdout}\n{up.stderr}"
            yield made
        finally:
            subprocess.run(
                ["bash", str(SCRIPT), "down"], env=made.script_env, capture_output=True, timeout=180
            )
