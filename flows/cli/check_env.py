"""`trtflow check-env`: compare this machine's environment with the one recorded here; when it changed, send the
Prefect event trtflow.environment.changed (exit 3) and record the new one."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtflow.flows.cli.base import CHECK_WOULD_RUN, Command, out


class CheckEnv(Command):
    name = "check-env"
    help = ("compare this machine's environment with the one recorded here; when it changed, send the Prefect event "
            "trtflow.environment.changed (exit 3) and record the new one")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--state", help="the record (default: $TRTFLOW_STATE_DIR/environment.json, else "
                                            "~/.local/state/trtflow/environment.json)")
        parser.add_argument("--no-event", action="store_true", help="only compare and record (exit 3 when it changed)")
        parser.add_argument("--json", action="store_true", help="print the fingerprint and the changed fields as JSON")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.flows import machine
        from trtflow.flows.fingerprint import describe

        state = Path(args.state).resolve() if args.state else machine.state_file()
        result = machine.check(state)
        changed = result.previous is not None and result.previous != result.fingerprint
        if changed and not args.no_event:
            machine.send(result)  # raises (exit 1) before anything is recorded
        if result.previous != result.fingerprint:
            machine.record(result, state)
        if args.json:
            sys.stdout.write(json.dumps({"state": str(state), "kind": result.kind, "host": result.host,
                                         "first_record": result.previous is None, "changed": result.changed,
                                         "fingerprint": result.fingerprint}, indent=2) + "\n")
        elif result.previous is None:
            out.print(f"recorded this machine's environment ({describe(result.fingerprint)}) in {state}")
        elif changed:
            out.print(f"environment changed: {'; '.join(result.changed)}" +
                      ("" if args.no_event else f" (sent {machine.EVENT}, gpu-kind {result.kind})"))
        else:
            out.print(f"environment unchanged ({describe(result.fingerprint)})")
        return CHECK_WOULD_RUN if changed else 0

