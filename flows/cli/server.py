"""`trtflow server`: the Prefect server trtflow keeps in the background when PREFECT_API_URL is not set."""
from __future__ import annotations

import argparse
import socket

from trtflow import settings
from trtflow.errors import SpecError
from trtflow.flows.cli.base import Command, out


class Server(Command):
    name = "server"
    help = "the Prefect server trtflow keeps in the background when PREFECT_API_URL is not set"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])
        parser.add_argument("--database", metavar="sqlite|local|URL",
                            help="start: what the server keeps its state in: Prefect's SQLite file, a PostgreSQL "
                                 "cluster trtflow keeps in its state directory (local), or a postgresql+asyncpg:// URL "
                                 "(default: TRTFLOW_SERVER_DATABASE, else sqlite); a fleet needs PostgreSQL")
        parser.add_argument("--host", default="127.0.0.1",
                            help="start: the address it listens on (0.0.0.0 for other machines; default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=None, help="start: its port (default: a free one)")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.flows import server

        if args.action == "stop":
            rec = server.stop()
            out.print(f"stopped the Prefect server at {rec.url} (pid {rec.pid})" if rec else
                      "no Prefect server of trtflow's was running")
            return 0
        if args.action == "start":
            database = _database(args.database)
            url = server.ensure(database=database, host=args.host, port=args.port)
            rec = server.current()
            down = server.database_down(rec) if rec else None
            if down is not None:  # a server that was running already, its database gone since
                raise down
            shown = rec.database if rec else server.shown_database(database or settings.SERVER_DATABASE.get())
            out.print(f"Prefect server running at {url} (UI: {url.removesuffix('/api')}) on {shown}; for other "
                      f"tools: export PREFECT_API_URL={url}", soft_wrap=True)
            if args.host not in ("127.0.0.1", "localhost"):
                out.print(f"other machines: export PREFECT_API_URL=http://{socket.gethostname()}:"
                          f"{url.rsplit(':', 1)[1]}", soft_wrap=True)
            return 0
        rec = server.running()
        if rec is None:
            out.print("no Prefect server of trtflow's is running (the next `trtflow run` that has work starts one)")
            return 1
        down = server.database_down(rec)
        if down is not None:
            raise down
        out.print(f"running at {rec.url} (pid {rec.pid}, log {rec.log}) on {rec.database}", soft_wrap=True)
        return 0


def _database(given: str | None) -> str | None:
    """--database checked as TRTFLOW_SERVER_DATABASE is, and a URL read (None: the variable's). Neither error
    repeats a URL: it may hold a password."""
    if given is None:
        return None
    from trtflow.flows import server

    try:
        settings.SERVER_DATABASE.check(given)
    except SpecError:
        shown = repr(given) if given.isalnum() else "the value given (not repeated: it may hold a password)"
        raise SpecError(f"--database: {shown} is not {settings.SERVER_DATABASE.accepts}") from None
    if given not in ("sqlite", "local"):
        server.database_url(given, "--database")
    return given


COMMAND = Server()
