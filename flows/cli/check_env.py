"""`trtflow check-env`: compare this machine's environment with the one recorded here; when it changed, send the
Prefect event trtflow.environment.changed (exit 3). The record advances when this machine's watcher has rebuilt
what the change made stale (`watch.py`), so a change no deployment acted on is sent again by the next check."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Iterator

from trtflow.flows.cli.base import CHECK_WOULD_RUN, Command, out


class CheckEnv(Command):
    name = "check-env"
    help = ("compare this machine's environment with the one recorded here; when it changed, send the Prefect event "
            "trtflow.environment.changed (exit 3); the record advances once this machine's watcher rebuilt")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--state", help="the record (default: $TRTFLOW_STATE_DIR/environment.json, else "
                                            "~/.local/state/trtflow/environment.json)")
        parser.add_argument("--no-event", action="store_true",
                            help="only compare, and record the new environment (exit 3 when it changed): for a "
                                 "machine without a watcher deployment")
        parser.add_argument("--json", action="store_true", help="print the fingerprint and the changed fields as JSON")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.flows import machine
        from trtflow.flows.keys import describe

        state = Path(args.state).resolve() if args.state else machine.state_file()
        result = machine.check(state)
        if not args.no_event:
            for reaped in _reap(result.host, args.verbose):  # its dead watcher runs hold its one-run slot: freed
                out.print(reaped.line(), soft_wrap=True)
        changed = result.previous is not None and result.previous != result.fingerprint
        if changed and not args.no_event:
            with _prefect_quiet(args.verbose):
                machine.send(result)  # raises (exit 1): the change is reported again next time
        elif result.previous != result.fingerprint:  # a first record, or --no-event
            machine.record(result, state)
        if args.json:
            sys.stdout.write(json.dumps({"state": str(state), "kind": result.kind, "host": result.host,
                                         "first_record": result.previous is None, "changed": result.changed,
                                         "fingerprint": result.fingerprint.to_json()}, indent=2) + "\n")
        elif result.previous is None:
            out.print(f"recorded this machine's environment ({describe(result.fingerprint)}) in {state}")
        elif changed:
            out.print(f"environment changed: {'; '.join(result.changed)}" +
                      ("" if args.no_event else f" (sent {machine.EVENT} for machine {result.host}, GPU kind "
                                                f"{result.kind}; recorded once its watcher has rebuilt)"))
        else:
            out.print(f"environment unchanged ({describe(result.fingerprint)})")
        return CHECK_WOULD_RUN if changed else 0


def _reap(machine: str, verbose: bool) -> list:
    """flows/reap.py, where there is a Prefect server to ask. A server that cannot be asked reaps nothing: a change
    to send then fails in `send`, with its one line (exit 1), and the next check tries both again."""
    from prefect.settings import PREFECT_API_URL

    from trtflow.flows import reap

    if not PREFECT_API_URL.value():
        return []
    try:
        with _prefect_quiet(verbose):
            return reap.reap(machine)
    except Exception:  # noqa: BLE001 - the server's or the network's failure (said by `send` where it matters)
        return []


@contextlib.contextmanager
def _prefect_quiet(verbose: bool) -> Iterator[None]:
    """Without --verbose, Prefect's events client does not print its own "Unable to connect ..." warning: the
    failure is the command's one `error:` line."""
    client = logging.getLogger("prefect.events.clients")
    disabled, client.disabled = client.disabled, client.disabled or not verbose
    try:
        yield
    finally:
        client.disabled = disabled


COMMAND = CheckEnv()
