"""A real single-node Slurm cluster for the tests: `munged`, `slurmctld` and `slurmd` from Debian's
`munge` and `slurm-wlm` (installed by `.ci/run`, as Chromium is), started in a temporary folder with
ports of their own and stopped after the session. Nothing here installs anything or reaches another
host: the controller and the node are this machine on 127.0.0.1.

Why a real cluster: submitit's local executor runs the same pickled calls, but not sbatch's parameter
names, a job's environment, `scancel`, or a scheduler that knows nothing of a job's end without
accounting (see `workbench.drivers.executor`). The configuration is the minimum a controller needs as
root without cgroups: `proctrack/linuxproc`, `task/none`, no accounting daemon.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scancel", "scontrol")
INSTALL = "apt-get install -y slurm-wlm munge"
PARTITION = "debug"


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: `env` points the Slurm commands at it (SLURM_CONF); `partition` its only one."""

    folder: Path
    conf: Path
    partition: str
    started: float  # time.time() when the daemons were started

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str) -> str:
        """A Slurm client command against this cluster; its stdout."""
        return subprocess.run(list(cmd), capture_output=True, text=True, check=True,
                              env={**os.environ, **self.env}).stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def write_conf(folder: Path) -> Path:
    host = socket.gethostname().split(".")[0]
    munge_socket = folder / "munge" / "munge.socket.2"
    conf = folder / "slurm.conf"
    conf.write_text(f"""\
ClusterName=bertology-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=600
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory={max(memory_mb() - 1024, 512)} State=UNKNOWN
PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def start(folder: Path, timeout_s: float = 60.0) -> SlurmCluster:
    """Start munged, slurmctld and slurmd in `folder`; return once `sinfo` shows the node idle."""
    missing = [cmd for cmd in DAEMONS + CLIENTS if shutil.which(cmd) is None]
    if missing:
        raise RuntimeError(f"the Slurm tests need {', '.join(missing)}: {INSTALL} (.ci/run does)")
    for sub in ("state", "spool", "log", "munge"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "munge").chmod(0o700)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = write_conf(folder)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = time.time()
    subprocess.run(["munged", "--force", f"--socket={folder}/munge/munge.socket.2", f"--key-file={key}",
                    f"--log-file={folder}/log/munged.log", f"--pid-file={folder}/munge/munged.pid",
                    f"--seed-file={folder}/munge/munged.seed"], check=True, capture_output=True)
    subprocess.run(["slurmctld", "-i"], check=True, env=env, capture_output=True)
    subprocess.run(["slurmd"], check=True, env=env, capture_output=True)
    cluster = SlurmCluster(folder, conf, PARTITION, started)
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        probe = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env)
        state = probe.stdout.strip()
        if state == "idle":
            return cluster
        time.sleep(0.5)
    stop(cluster)
    log = (folder / "log" / "slurmctld.log").read_text()[-2000:] if (folder / "log" / "slurmctld.log").exists() else ""
    raise RuntimeError(f"the Slurm node did not become idle in {timeout_s:.0f} s (sinfo: {state!r}); {log}")


def stop(cluster: SlurmCluster) -> None:
    """Cancel what still runs, stop the daemons (by their pid files) and wait for them to exit; then
    end any job step left behind (a `slurmstepd` started since the cluster was, orphaned by slurmd)."""
    import psutil

    folder = cluster.folder
    env = {**os.environ, **cluster.env}
    subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        live = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()
        if not live:
            break
        time.sleep(0.3)
    pids = []
    for pid_file in (folder / "slurmd.pid", folder / "slurmctld.pid", folder / "munge" / "munged.pid"):
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    deadline = time.monotonic() + 15
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for process in psutil.process_iter(["name", "create_time"]):
        if (process.info["name"] or "").startswith("slurmstepd") and process.info["create_time"] >= cluster.started:
            try:
                process.kill()
            except psutil.Error:
                pass


# The submitit executors a driver's sweep test runs on: submitit's local one, and this cluster.
SUBMITIT_EXECUTORS = [pytest.param("submitit-local"), pytest.param("slurm", marks=pytest.mark.slurm)]


def executor_flags(executor: str, request) -> list[str]:
    """`--executor` and, on Slurm, the partition of the test session's cluster (the `slurm_cluster` fixture)."""
    if executor == "slurm":
        return ["--executor", "slurm", "--slurm-partition", request.getfixturevalue("slurm_cluster").partition]
    return ["--executor", executor]
