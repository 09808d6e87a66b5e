"""`trtflow server`: the Prefect server trtflow keeps in the background when PREFECT_API_URL is not set."""
from __future__ import annotations

import argparse

from trtflow.flows.cli.base import Command, out


class Server(Command):
    name = "server"
    help = "the Prefect server trtflow keeps in the background when PREFECT_API_URL is not set"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.flows import server

        if args.action == "stop":
            rec = server.stop()
            out.print(f"stopped the Prefect server at {rec.url} (pid {rec.pid})" if rec else
                      "no Prefect server of trtflow's was running")
            return 0
        if args.action == "start":
            url = server.ensure()
            out.print(f"Prefect server running at {url} (UI: {url.removesuffix('/api')}); for other tools: "
                      f"export PREFECT_API_URL={url}")
            return 0
        rec = server.running()
        if rec is None:
            out.print("no Prefect server of trtflow's is running (the next `trtflow run` that has work starts one)")
            return 1
        out.print(f"running at {rec.url} (pid {rec.pid}, log {rec.log})")
        return 0

