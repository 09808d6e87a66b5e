"""This machine's watcher runs that died with their process (the machine lost power, the process was killed): Prefect
still shows them Running, and the one-run-at-a-time slot of the machine's watcher deployment (`concurrency_limit: 1`
in `init-deploy`'s prefect.yaml) stays theirs until its lease runs out, which their flow engine had renewed for 300
s. Until then the machine's next watcher run, however it is started, waits in Scheduled.

`trtflow check-env` (cron, every 15 minutes, and after a restart) marks them Crashed, which frees the slot: a run of
deployment `watch-<this machine>` whose process (`infrastructure_pid`: the process worker's pid for it, on this
machine since the deployment's work queue is this machine's) no longer runs, or is another process started after the
run began (a reused pid), is dead. Nothing it was writing was published: the next run redoes it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from trtflow import procfs

ACTIVE = ["RUNNING", "PENDING", "CANCELLING"]
SLACK_S = 5.0  # a run's process starts a moment before the run is marked started


@dataclass(frozen=True)
class Reaped:
    run: str  # the flow run's name
    pid: int

    def line(self) -> str:
        return f"marked watcher run '{self.run}' crashed: its process (pid {self.pid}) is gone"


def reap(machine: str) -> list[Reaped]:
    """Mark this machine's dead watcher runs Crashed (see the module); what was marked."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.states import Crashed

    reaped = []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[f"watch-{machine}"])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=ACTIVE))))
        for run in runs:
            pid = _pid(run.infrastructure_pid)
            began = (run.start_time or run.expected_start_time or datetime.now(timezone.utc)).timestamp()
            if pid is None or _alive_since(pid, began):
                continue
            done = Reaped(run.name, pid)
            client.set_flow_run_state(run.id, Crashed(message=f"trtflow check-env on {machine}: {done.line()}"))
            reaped.append(done)
    return reaped


def _pid(infrastructure_pid: str | None) -> int | None:
    """The pid a process worker recorded (`1234`; a runner records `host:1234`)."""
    text = (infrastructure_pid or "").rsplit(":", 1)[-1]
    return int(text) if text.isdigit() else None


def _alive_since(pid: int, began: float) -> bool:
    """Whether process `pid` runs and was started no later than `began` (a Unix time) plus a little slack."""
    ticks = procfs.started(pid)
    if ticks is None:
        return False
    started = time.time() - procfs.seconds(procfs.now_ticks() - ticks)
    return started <= began + SLACK_S and started <= time.time()
