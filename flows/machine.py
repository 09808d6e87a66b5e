"""`trtflow check-env`: this machine's environment fingerprint against the one last recorded here; when they
differ, a Prefect event `trtflow.environment.changed` that deployments trigger on (see `flows/templates/`).

The record lives outside any store, per machine: `$TRTFLOW_STATE_DIR/environment.json`, else
`$XDG_STATE_HOME/trtflow/environment.json`, else `~/.local/state/trtflow/environment.json`.
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtflow import files, settings
from trtflow.errors import TrtflowError
from trtflow.flows import keys
from trtflow.flows.keys import ALL, Environment, fingerprint
from trtflow.flows.store import write_json_atomic
from trtflow.state import state_dir

EVENT = "trtflow.environment.changed"


class EventNotSent(TrtflowError):
    exit_code = 1


def state_file() -> Path:
    return state_dir() / "environment.json"


def machine_name() -> str:
    """This machine's name in a fleet: `$TRTFLOW_MACHINE`, else the host name. check-env's events, the deployment
    `trtflow init-deploy --machine` writes and the GPU tags of stage tasks all use it."""
    return settings.MACHINE.get() or socket.gethostname()


def machine_kind(env: Environment) -> str:
    """The GPU kind a fleet groups machines by (work pool per kind): `$TRTFLOW_GPU_KIND`, else the first GPU's
    name as a slug (`nvidia-a100-sxm4-80gb`), else `cpu`."""
    if kind := settings.GPU_KIND.get():
        return kind
    first = next(iter(env.gpus.values()), None)
    return re.sub(r"[^a-z0-9]+", "-", first.name.lower()).strip("-") if first else "cpu"


class MachineRecord(BaseModel):
    """check-env's record of this machine (`state_file()`): the environment it last recorded, and as what."""
    fingerprint: Environment | None = None
    host: str | None = None
    kind: str | None = None


@dataclass
class Check:
    fingerprint: Environment
    previous: Environment | None
    kind: str
    host: str = field(default_factory=machine_name)

    @property
    def changed(self) -> list[str]:
        return keys.diff(self.previous, self.fingerprint) if self.previous is not None else []

    def event(self) -> dict[str, Any]:
        return {"event": EVENT,
                "resource": {"prefect.resource.id": f"trtflow.machine.{self.host}", "trtflow.gpu-kind": self.kind,
                             "trtflow.host": self.host},
                "payload": {"changed": self.changed, "fingerprint": self.fingerprint.to_json(),
                            "previous": self.previous.to_json() if self.previous is not None else None}}


def check(state: Path | None = None) -> Check:
    state = state or state_file()
    previous = None
    if state.exists():
        try:
            previous = MachineRecord.model_validate(files.read_json(state, files.RECORD_BYTES)).fingerprint
        except (OSError, ValueError):
            previous = None  # unreadable: recorded afresh, reported as a first record
    env = fingerprint(ALL) or Environment()
    return Check(env, previous, machine_kind(env))


def record(result: Check, state: Path | None = None) -> Path:
    state = state or state_file()
    state.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(state, MachineRecord(fingerprint=result.fingerprint, host=result.host, kind=result.kind)
                      .model_dump(mode="json"))
    return state


def send(result: Check) -> None:
    """The event, to the Prefect server in PREFECT_API_URL, synchronously (a cron job exits right after)."""
    import asyncio

    from prefect.events import Event
    from prefect.events.clients import PrefectEventsClient
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise EventNotSent("no Prefect server to tell: PREFECT_API_URL is not set; the change was not recorded, so "
                           "the next check reports it again")

    async def emit() -> None:
        async with PrefectEventsClient(api_url=url) as client:
            await client.emit(Event(**result.event()))
    try:
        asyncio.run(emit())
    except Exception as exc:  # noqa: BLE001 - any transport failure is one line; nothing is recorded
        raise EventNotSent(f"could not send {EVENT} to {url}: {type(exc).__name__}: {exc}; the change was not "
                           f"recorded, so the next check reports it again") from exc


def gpu_tag(name: str, device: str) -> str:
    """`gpu:<machine>:<device>`, the tag of stage tasks that use that GPU. The machine is in it: Prefect's tag
    limits are global to the server, and a limit on `gpu:0` would hold every machine's device 0 at once. No '/':
    Prefect 3.8 keeps a tag's limit as a global limit named `tag:<tag>`, whose names refuse '/', '%', '&', '<' and
    '>' (with `gpu:<machine>/<device>`, `init-deploy --limits` failed with the server's 500)."""
    return f"gpu:{name}:{device}"


def gpu_tags(name: str, check_result: Check | None) -> list[str]:
    """The GPU tags stage tasks on machine `name` carry: one per GPU it has (device 0 when none is seen)."""
    devices = sorted(check_result.fingerprint.gpus) if check_result else []
    return [gpu_tag(name, i) for i in devices or ["0"]]


def create_gpu_limits(name: str, check_result: Check | None) -> list[str]:
    """A Prefect tag concurrency limit of 1 on each of this machine's GPU tags: task runs carrying it (every
    stage that uses that GPU, in any flow run) run one at a time. Existing limits are set to 1."""
    from prefect.client.orchestration import get_client

    tags = gpu_tags(name, check_result)
    with get_client(sync_client=True) as client:
        for tag in tags:
            client.create_concurrency_limit(tag=tag, concurrency_limit=1)
    return tags
