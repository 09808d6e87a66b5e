"""`trtflow run`: run the pipeline (a Prefect flow run)."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from rich.markup import escape

from trtflow import phases, settings
from trtflow.errors import PrefectUnavailable
from trtflow.flows.cli.base import Command, add_pipeline_arguments, add_selection_arguments, err, out, store_option

if TYPE_CHECKING:
    from trtflow.flows.results import Verdict

EPHEMERAL_STARTUP_S = 120


class Run(Command):
    name = "run"
    help = "run the pipeline (a Prefect flow run)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_pipeline_arguments(parser)
        add_selection_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        # Prefect's temporary server otherwise phones home, and on machines without internet access prints a
        # traceback per attempt. A user who wants telemetry can set the variable to true.
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        # Prefect gives its temporary server 20 s to start, which a busy machine misses: give it more.
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(EPHEMERAL_STARTUP_S))
        # Fail fast on spec and store problems, before paying for Prefect's start-up.
        from trtflow.flows.runner import make_runner

        started = time.perf_counter()
        with phases.phase("pipeline load, keys, store look-ups"):
            runner = make_runner(args.pipeline, args.overrides, str(store_option(args.store) or "") or None)
            for name in args.force or []:
                if name != "*":
                    runner.check_stage_name(name, "--force")
            runner.select(args.stages)
            reused = runner.reuse_all(args.stages, args.force)
        if reused is not None:  # nothing to run: no flow run, no Prefect start-up
            return _say_reused(reused, runner, started, args.argv)
        for note in runner.store.notes:  # what the store did while looking (a result published again), said once
            err.print(f"store: {note}", markup=False, soft_wrap=True)
        from trtflow.flows import isolate

        # stages will run: their fork server starts now, importing what they will import
        isolate.warm_up(runner.imports(runner.pending))

        with phases.phase("Prefect: imports, server check"):
            api_url = _server()
            from trtflow.flows import pipeline_flow  # noqa: F401 - Prefect sets its logging up on import: quiet it

        if not args.verbose:
            _quiet_prefect_console()
        status = out.status("starting Prefect ...")
        status.start()
        try:
            with phases.phase("flow run (wall)"):
                results = _flow_run(args, runner, api_url, status)
        finally:
            status.stop()
        ran = sum(r.status == "ran" for r in results)
        for r in results:
            _say_verdict(r.stage, r)
        out.print(f"[green]done[/] {len(results)} stages ({ran} ran, {len(results) - ran} reused) in "
                  f"{time.perf_counter() - started:.1f}s; artifacts in {runner.store.location}")
        return 0


def _server() -> str | None:
    """trtflow's background Prefect server's API URL (started where it is not running), where one is wanted."""
    from trtflow.flows import server

    if not server.wanted():
        return None
    with out.status("starting a Prefect server in the background ..."):
        return server.ensure(on_start=lambda url: err.print(
            f"started a Prefect server in the background: {url.removesuffix('/api')} (its UI; `trtflow server "
            f"stop` stops it)", soft_wrap=True))


def _say_reused(reused: list, runner: Any, started: float, argv: list[str]) -> int:
    """Every stage reused, said without a flow run; recorded for the next run of the same command, which then
    answers from the record while nothing changes (flows/noop.py), and posted to Prefect as a cached run."""
    from rich.text import Text

    from trtflow.flows import noop
    from trtflow.flows.results import Verdict

    lines = [f"  {'[green]reused[/]':>20} [bold]{o.name}[/] ({escape(o.kind)}) {o.seconds:6.2f}s  key "
             f"{o.key[:12]}  [dim]{escape(o.reason)}[/]" for o in reused]
    lines += [line for o in reused for line in _verdict_lines(o.name, Verdict.of(o.manifest))]
    for line in lines:
        out.print(line, soft_wrap=True)
    done = f"[green]done[/] {len(reused)} stages (0 ran, {len(reused)} reused) in "
    out.print(f"{done}{time.perf_counter() - started:.1f}s, no flow run needed; artifacts in "
              f"{escape(runner.store.location)}", soft_wrap=True)
    record = noop.write(argv, runner, [Text.from_markup(line).plain for line in lines],
                        Text.from_markup(done).plain + "{seconds}s, nothing changed since the last run (no flow run; "
                        f"its record checked); artifacts in {runner.store.location}")
    if record is not None:
        noop.post_detached(record)
    return 0


def _flow_run(args: argparse.Namespace, runner: Any, api_url: str | None, status: Any) -> list:
    """The pipeline as a Prefect flow run, each stage said as it starts and ends: its stage reports."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from trtflow import progress
    from trtflow.flows import pipeline_flow as pf
    from trtflow.flows.results import StageReport

    eta = progress.Eta()

    def on_progress(what: str, done: int, total: int) -> None:
        status.update(f"{escape(eta.said(what, done, total))} ...")

    watched = api_url or PREFECT_API_URL.value()
    try:
        with pf.watching(_listener(status)), progress.listening(on_progress), \
                temporary_settings(updates={PREFECT_API_URL: api_url} if api_url else {}), \
                _server_watch(watched, bool(api_url)), pf.handing_over(runner, args.pipeline, args.overrides):
            return [StageReport.model_validate(r) for r in pf.pipeline_flow(
                pipeline_file=args.pipeline, overrides=args.overrides, stages=args.stages, force=args.force,
                store=runner.store.location)]
    except RuntimeError as exc:
        if api_url and str(exc).startswith("Failed to reach API at"):  # Prefect's client gave up on it
            raise PrefectUnavailable(_lost(api_url, True, None)) from None
        raise _prefect_unavailable(exc) or exc from None


def _listener(status: Any) -> Any:
    """What the console says of each stage event of the flow run."""

    def listen(event: str, name: str, payload: Any) -> None:
        if event == "flow" and payload:
            out.print(f"  flow run: {escape(payload)}", soft_wrap=True)
        elif event == "start":
            status.update(f"stage [bold]{name}[/] ...")
        elif event == "done":
            o = payload
            mark = "[green]reused[/]" if o.status == "reused" else "[cyan]ran[/]"
            out.print(f"  {mark:>20} [bold]{name}[/] ({escape(o.kind)}) {o.seconds:6.2f}s  key {o.key[:12]}  "
                      f"[dim]{escape(o.reason)}[/]")
            for w in o.manifest.warnings if o.status == "ran" else []:
                out.print(f"           [yellow]warning:[/] {escape(w)}")
        elif event == "fail":
            out.print(f"  [red]{'failed':>9}[/] [bold]{name}[/] ({escape(payload.kind)}) {payload.seconds:6.2f}s")
        elif event == "skip":
            out.print(f"  [yellow]{'skipped':>9}[/] [bold]{name}[/] "
                      f"[dim](needs {escape(payload)}, which failed)[/]")

    return listen


def _say_verdict(stage: str, verdict: Verdict) -> None:
    for line in _verdict_lines(stage, verdict):
        out.print(line, soft_wrap=True)


def _verdict_lines(stage: str, verdict: Verdict) -> list[str]:
    """What a stage's decisions mean for deployment, one line each (trtflow/decisions.py words them)."""
    from trtflow.decisions import sentences

    return [f"  [yellow]{escape(line)}[/]" for line in sentences(stage, verdict.decisions)]


SERVER_CHECK_S = 3.0  # while a run is going, the server's /health is asked this often
SERVER_LOST_AFTER = 3  # refused connections in a row: the server is gone
# a server that takes connections and does not answer is slow (SQLite writes, a busy machine, a paused VM): it is
# given settings.SERVER_PATIENCE (default 300 s), as Prefect's own client retries for minutes
SERVER_SLOW_SAY_S = 15.0  # said once on the console after this long without an answer


def _lost(url: str, ours: bool, silent: float | None, kept: str = "") -> str:
    """The one line for a run ended by its Prefect server: gone (`silent` None: refused connections, its process
    ended, Prefect's client gave up) or silent past the patience. A new background server is promised only when
    trtflow's own server process is gone (the next run starts one only then)."""
    from trtflow.flows import server

    what = ("stopped answering during the run" if silent is None else
            f"took connections but did not answer for {silent:.0f} s (TRTFLOW_SERVER_PATIENCE)")
    kept = f"; {kept}" if kept else ""
    if not ours:
        return (f"the Prefect server at {url} {what}{kept}; "
                + ("start it again and run again" if silent is None else "run again when it answers"))
    rec = server.recorded(url)
    if rec is None or not server.alive(rec):
        return (f"trtflow's background Prefect server at {url} {what}{kept}; its process is gone: run again (the "
                f"next run starts a new one)")
    return (f"trtflow's background Prefect server at {url} {what}{kept}; its process (pid {rec.pid}) lives: run "
            f"again when it answers (or `trtflow server stop` first: the next run then starts a new one)")


class ServerLost(BaseException):
    """Raised in the main thread when the watcher found the run's Prefect server gone: the run unwinds as from
    Ctrl-C (stages stopped, staging removed, `finally` blocks run), then the CLI says the watcher's one line."""


LOST_SIGNAL = signal.SIGUSR1  # how the watcher's thread interrupts the main thread (even in a blocking call)


@contextlib.contextmanager
def _server_watch(url: str | None, ours: bool) -> Iterator[None]:
    """While the run goes on, check that the Prefect server answers. When it is gone (connections refused, or
    trtflow's own server process ended), the run cannot record anything more and Prefect's client would retry for
    minutes before failing with its own traceback: the stages are stopped (nothing they were writing is
    published), Prefect's client stops retrying, the main thread is interrupted and unwinds, and the context
    ends raising PrefectUnavailable (exit 3) with one line. A server that takes connections and does not answer is
    slow, not gone: it is waited for (said once), up to TRTFLOW_SERVER_PATIENCE seconds."""
    if not url:  # Prefect's temporary server lives and dies with this process
        yield
        return
    from prefect.settings import get_current_settings

    from trtflow.flows import server

    done = threading.Event()
    lost: list[str] = []
    prefect_settings = get_current_settings()  # the run's (temporary_settings made its own copy)
    main = threading.current_thread() is threading.main_thread()

    def interrupted(signum, frame) -> None:  # noqa: ANN001 - a signal handler
        if lost:
            raise ServerLost()

    def give_up(line: str) -> None:
        from trtflow.flows.isolate import kill_all

        lost.append(line)
        prefect_settings.client.max_retries = 0  # its requests to a gone server fail at once while unwinding
        kill_all()
        if main:
            signal.pthread_kill(threading.main_thread().ident, LOST_SIGNAL)

    watcher = threading.Thread(target=_watch, args=(url, ours, server.recorded(url) if ours else None, done, give_up),
                               name="trtflow-server-watch", daemon=True)
    previous = signal.signal(LOST_SIGNAL, interrupted) if main else None
    watcher.start()
    try:
        yield
    except BaseException:
        if lost:
            raise PrefectUnavailable(lost[0]) from None
        raise
    finally:
        done.set()
        if main:
            signal.signal(LOST_SIGNAL, previous)
    if lost:  # the run ended on its own meanwhile, but nothing more of it reached the server
        raise PrefectUnavailable(lost[0])


def _watch(url: str, ours: bool, rec: Any, done: threading.Event, give_up: Callable[[str], None]) -> None:
    """The watcher's loop (see _server_watch): `give_up` gets the one line once the server is gone."""
    from trtflow.flows import server

    patience = settings.SERVER_PATIENCE.get()
    refused, answered, said = 0, time.monotonic(), False
    while not done.wait(SERVER_CHECK_S):
        ok, gone = _probe(url)
        if ok:
            refused, answered = 0, time.monotonic()
            continue
        refused = refused + 1 if gone else 0
        ended = rec is not None and not server.alive(rec)
        lost = ended or refused >= SERVER_LOST_AFTER  # the server is gone, not slow
        silent = time.monotonic() - answered  # since its last answer (or the run's start)
        if not gone and not ended and not said and silent >= SERVER_SLOW_SAY_S:
            said = True
            sys.stderr.write(f"waiting for the Prefect server at {url}: no answer for {silent:.0f} s\n")
            sys.stderr.flush()
        if (lost or silent >= patience) and not done.is_set():
            kept = "the running stages were stopped and nothing they were writing was kept"
            give_up(_lost(url, ours, None if lost else silent, kept))
            return


def _probe(url: str) -> tuple[bool, bool]:
    """(the server answered healthy, nobody listens at `url`): a connection taken but not answered in time is a slow
    server, not a gone one."""
    import httpx

    from trtflow.flows import server

    try:
        return server.health(url, SERVER_CHECK_S) == 200, False
    except httpx.ConnectError:
        return False, True
    except httpx.HTTPError:
        return False, False


def _quiet_prefect_console() -> None:
    """Prefect prints every task failure with a traceback; the CLI shows one line instead.

    Only the console is quieted: logs still reach the Prefect server (UI) through its API handler, whose own
    failures (`--- Error logging to API ---`, a server gone) are not printed either (`logging.raiseExceptions`).
    """
    import logging

    logging.raiseExceptions = False

    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            if _prints_to_console(lg, h, PrefectConsoleHandler):
                h.setLevel(logging.CRITICAL)


def _prints_to_console(logger: Any, handler: Any, console: type) -> bool:
    """Prefect's console handler, wherever it is; and any stream handler of Prefect's own loggers: prefect._internal
    has one of its own (logging.yml's `debug`), not propagated, whose services print each event they could not send
    when the server went away. (Public types only: tests/test_prefect_pins.py pins what they find.)"""
    import logging

    own = logger.name.startswith("prefect.") and isinstance(handler, logging.StreamHandler)
    return isinstance(handler, console) or own


def _prefect_unavailable(exc: RuntimeError) -> PrefectUnavailable | None:
    """Prefect's own errors when its API cannot be reached, as one line saying what to do."""
    text = str(exc)
    if "ephemeral Prefect API server" in text:
        budget = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "20")
        return PrefectUnavailable(
            f"Prefect's temporary server did not start within {budget} s (a busy machine?): start a server once "
            f"with 'prefect server start' and set PREFECT_API_URL=http://127.0.0.1:4200/api, or raise "
            f"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")
    if text.startswith("Failed to reach API at"):
        return PrefectUnavailable(f"{text.rstrip('.')} (PREFECT_API_URL): start that server ('prefect server "
                                  f"start'), or unset PREFECT_API_URL to use a temporary one")
    return None


COMMAND = Run()
