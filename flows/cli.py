"""`trtflow`: run, plan and validate pipeline files; print the JSON Schema.

Every failure ends with one line on stderr and a non-zero exit code; `--verbose` adds the traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trtflow.errors import PrefectUnavailable, StageError, TrtflowError

EPHEMERAL_STARTUP_S = 120

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and Prefect's logs")

    pipe = argparse.ArgumentParser(add_help=False)
    pipe.add_argument("pipeline", help="the pipeline YAML file")
    pipe.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a value, e.g. --set stages.build.workspace=2GiB (repeatable)")
    pipe.add_argument("--store", help="artifact store root (default: the pipeline's 'artifacts:' or .trtflow/)")

    select = argparse.ArgumentParser(add_help=False)
    select.add_argument("--stage", dest="stages", action="append", metavar="NAME",
                        help="run only this stage and what it depends on (repeatable)")
    select.add_argument("--force", action="append", nargs="?", const="*", metavar="NAME",
                        help="re-run even if cached: every selected stage, or the one named (repeatable)")

    ap = argparse.ArgumentParser(prog="trtflow", parents=[common],
                                 description="Declarative ONNX -> TensorRT pipelines, run as Prefect flows.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("run", parents=[common, pipe, select], help="run the pipeline (a Prefect flow run)")
    sub.add_parser("plan", parents=[common, pipe, select], help="show, per stage, reused or stale and why")
    sub.add_parser("validate", parents=[common, pipe], help="check the pipeline file only (fast, no Prefect)")
    sch = sub.add_parser("schema", parents=[common], help="print the pipeline JSON Schema (for editors)")
    sch.add_argument("-o", "--output", help="write to this file instead of stdout")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        err.print("[red]error:[/] interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place that turns failures into one line
        return _fail(exc, args.verbose)


def _fail(exc: BaseException, verbose: bool) -> int:
    if verbose:
        err.print_exception(show_locals=False)
    known = isinstance(exc, TrtflowError)
    message = str(exc) if known else f"{type(exc).__name__}: {exc}"
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    if not known and not verbose:
        err.print("(unexpected: run again with --verbose for the traceback)")
    return exc.exit_code if known else 1


# --- commands --------------------------------------------------------------------------------------------------

def cmd_schema(args: argparse.Namespace) -> int:
    from trtflow.pipelines.pipeline import json_schema

    text = json.dumps(json_schema(), indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
        out.print(f"wrote {args.output}")
    else:
        sys.stdout.write(text + "\n")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from trtflow.pipelines.graph import build_graph
    from trtflow.pipelines.loader import load_pipeline

    loaded = load_pipeline(args.pipeline, args.overrides)
    graph = build_graph(loaded)
    table = Table(title=f"{loaded.spec.name}: {len(graph.order)} stages", title_justify="left")
    table.add_column("stage")
    table.add_column("kind")
    table.add_column("inputs")
    for name in graph.order:
        node = graph.nodes[name]
        ins = ", ".join([f"{slot} <- " + ", ".join(f"{e.stage}.{e.output}" for e in edges)
                         for slot, edges in node.inputs.items()]
                        + [f"{slot} <- {pattern}" for slot, (pattern, _) in node.spec.data_globs().items()])
        table.add_row(name, escape(node.spec.kind), escape(ins) or "-")
    out.print(table)
    out.print(f"[green]ok[/] {args.pipeline} is valid")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from trtflow.flows.runner import Runner
    from trtflow.flows.store import LocalStore
    from trtflow.pipelines.loader import load_pipeline

    loaded = load_pipeline(args.pipeline, args.overrides)
    runner = Runner(loaded, store=LocalStore(Path(args.store).resolve() if args.store else loaded.store_root))
    for name in args.force or []:
        if name != "*":
            runner.check_stage_name(name, "--force")
    items = runner.plan(args.stages, args.force)
    table = Table(title=f"plan for {loaded.spec.name} (store: {runner.store.root})", title_justify="left")
    for col in ("stage", "kind", "action", "why", "key", "environment"):
        table.add_column(col, overflow="fold")
    style = {"reuse": "green", "run": "yellow", "error": "red"}
    for it in items:
        table.add_row(it.name, escape(it.kind), f"[{style[it.action]}]{it.action}[/]", escape(it.reason),
                      (it.key or "")[:12], it.environment)
    out.print(table)
    n_run = sum(i.action == "run" for i in items)
    out.print(f"{n_run} to run, {sum(i.action == 'reuse' for i in items)} reused")
    return StageError.exit_code if any(i.action == "error" for i in items) else 0


def _quiet_prefect_console() -> None:
    """Prefect prints every task failure with a traceback; the CLI shows one line instead.

    Only the console is quieted: logs still reach the Prefect server (UI) through its API handler.
    """
    import logging

    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            if isinstance(h, PrefectConsoleHandler):
                h.setLevel(logging.CRITICAL)


def cmd_run(args: argparse.Namespace) -> int:
    # Prefect's temporary server otherwise phones home, and on machines without internet access prints a
    # traceback per attempt. A user who wants telemetry can set the variable to true.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect gives its temporary server 20 s to start, which a busy machine misses: give it more.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(EPHEMERAL_STARTUP_S))
    # Fail fast on spec and store problems, before paying for Prefect's start-up.
    from trtflow.flows.pipeline_flow import make_runner

    runner = make_runner(args.pipeline, args.overrides, args.store)
    for name in args.force or []:
        if name != "*":
            runner.check_stage_name(name, "--force")
    runner.select(args.stages)

    from trtflow.flows import pipeline_flow as pf

    if not args.verbose:
        _quiet_prefect_console()
    started = time.perf_counter()
    status = out.status("starting Prefect ...")
    status.start()

    def listen(event: str, name: str, payload: Any) -> None:
        if event == "start":
            status.update(f"stage [bold]{name}[/] ...")
        elif event == "done":
            o = payload
            mark = "[green]reused[/]" if o.status == "reused" else "[cyan]ran[/]"
            out.print(f"  {mark:>20} [bold]{name}[/] ({escape(o.kind)}) {o.seconds:6.2f}s  key {o.key[:12]}  "
                      f"[dim]{escape(o.reason)}[/]")
            for w in o.manifest.get("warnings", []) if o.status == "ran" else []:
                out.print(f"           [yellow]warning:[/] {escape(w)}")
        elif event == "fail":
            out.print(f"  [red]{'failed':>9}[/] [bold]{name}[/]")

    def on_progress(what: str, done: int, total: int) -> None:
        status.update(f"{what} {done}/{total} ...")

    from trtflow.stages import progress

    pf.LISTENERS.append(listen)
    progress.LISTENERS.append(on_progress)
    try:
        results = pf.pipeline_flow(pipeline_file=args.pipeline, overrides=args.overrides, stages=args.stages,
                                   force=args.force, store=str(runner.store.root))
    except RuntimeError as exc:
        raise _prefect_unavailable(exc) or exc from None
    finally:
        status.stop()
        pf.LISTENERS.remove(listen)
        progress.LISTENERS.remove(on_progress)
    ran = sum(r["status"] == "ran" for r in results)
    out.print(f"[green]done[/] {len(results)} stages ({ran} ran, {len(results) - ran} reused) in "
              f"{time.perf_counter() - started:.1f}s; artifacts in {runner.store.root}")
    return 0


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


COMMANDS = {"run": cmd_run, "plan": cmd_plan, "validate": cmd_validate, "schema": cmd_schema}

if __name__ == "__main__":
    raise SystemExit(main())
