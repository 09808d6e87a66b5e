"""`trtflow`: run, plan and validate pipeline files; verify the store; reduce a failing model; check this machine's
environment; write the deployments' prefect.yaml; manage the background Prefect server; print the JSON Schema.

Every failure ends with one line on stderr and a non-zero exit code; `--verbose` adds the traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trtflow.errors import PrefectUnavailable, StageError, StoreError, TrtflowError

EPHEMERAL_STARTUP_S = 120
CHECK_WOULD_RUN = 3  # `plan --check`: something would run

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
    pln = sub.add_parser("plan", parents=[common, pipe, select], help="show, per stage, reused or stale and why")
    pln.add_argument("--json", action="store_true", help="print the plan as JSON (per stage: action, reason, key, "
                                                         "environment and the environment fields that changed)")
    pln.add_argument("--check", action="store_true", help="exit 0 when nothing would run, 3 when something would "
                                                          "(for cron jobs and pre-commit hooks)")
    sub.add_parser("validate", parents=[common, pipe], help="check the pipeline file only (fast, no Prefect)")
    red = sub.add_parser("reduce", parents=[common],
                         help="cut a failing model down to a small subgraph that still fails (for a bug report)")
    red.add_argument("model", help="the FP32 ONNX model that fails the check")
    red.add_argument("--check", required=True, choices=["fp16", "int8", "parse", "build", "command"],
                     help="fp16/int8: simulated precision differs from FP32 (ONNX Runtime); parse/build: the "
                          "installed TensorRT rejects it; command: --command exits non-zero")
    red.add_argument("--qdq", metavar="MODEL", help="int8: a Q/DQ model of MODEL (the calibrate stage's variant): "
                                                    "its ranges and quantized nodes (default: MinMax of the samples)")
    red.add_argument("--command", dest="check_command", metavar="CMD",
                     help="command: run on each subgraph; {model} is its path, {inputs} an .npz of its input values")
    red.add_argument("--data", metavar="FILE", help=".npz of input arrays by name (.npy for one input); a leading "
                                                    "extra axis holds several samples (default: random)")
    red.add_argument("--shapes", action="append", default=[], metavar="NAME=1x3x224x224",
                     help="shape of a dynamic input for random data (repeatable)")
    red.add_argument("--samples", type=int, default=2, help="random samples (default 2)")
    red.add_argument("--seed", type=int, default=0)
    red.add_argument("--bound", type=float, help="fp16/int8: the cosine an output must reach (default: validate's: "
                                                 "0.999 FP16, 0.99 INT8)")
    red.add_argument("--timeout", type=float, default=600, help="command: seconds per run (default 600)")
    red.add_argument("-o", "--output", help="where to write the reduced model (default: <model>.reduced.onnx in "
                                            "the current directory)")
    red.add_argument("--json", action="store_true", help="print the result as JSON")
    ver = sub.add_parser("verify", parents=[common],
                         help="re-hash every stored result against its manifest (--repair drops what differs)")
    ver.add_argument("pipeline", nargs="?", help="a pipeline file: verify its store (default: --store)")
    ver.add_argument("--store", help="artifact store root (default: the pipeline's, else .trtflow/)")
    ver.add_argument("--repair", action="store_true",
                     help="remove results that do not match and staging of dead runs (the next run recomputes)")
    ptx = sub.add_parser("parse-trtexec", parents=[common],
                         help="read a trtexec log into numbers (exit 0: a performance summary was found, 1: none)")
    ptx.add_argument("log", help="trtexec's text output (any TensorRT version; prefixed or indented lines are fine)")
    ptx.add_argument("--json", action="store_true", help="print the result as JSON")
    ptx.add_argument("--all", action="store_true", help="every run of a log that holds several (a JSON list)")
    env = sub.add_parser("check-env", parents=[common],
                         help="compare this machine's environment with the one recorded here; when it changed, send "
                              "the Prefect event trtflow.environment.changed (exit 3) and record the new one")
    env.add_argument("--state", help="the record (default: $TRTFLOW_STATE_DIR/environment.json, else "
                                     "~/.local/state/trtflow/environment.json)")
    env.add_argument("--no-event", action="store_true", help="only compare and record (exit 3 when it changed)")
    env.add_argument("--json", action="store_true", help="print the fingerprint and the changed fields as JSON")
    dep = sub.add_parser("init-deploy", parents=[common],
                         help="write the prefect.yaml of the watcher deployments (schedule, event trigger, work pool "
                              "per GPU kind) into a model repo")
    dep.add_argument("-o", "--output", default="prefect.yaml", help="where to write it (default: ./prefect.yaml)")
    dep.add_argument("--force", action="store_true", help="overwrite an existing file")
    srv = sub.add_parser("server", parents=[common],
                         help="the Prefect server trtflow keeps in the background when PREFECT_API_URL is not set")
    srv.add_argument("action", choices=["start", "stop", "status"])
    sch = sub.add_parser("schema", parents=[common], help="print the pipeline JSON Schema (for editors)")
    sch.add_argument("-o", "--output", help="write to this file instead of stdout")
    return ap


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or `kill` ending the run): unwound like Ctrl-C, so stages' processes are killed and
    staging is removed on the way out."""


def _terminate(signum, frame) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        return COMMANDS[args.command](args)
    except Terminated:
        err.print("[red]error:[/] terminated (SIGTERM); nothing half-written was kept")
        return 143
    except KeyboardInterrupt:
        err.print("[red]error:[/] interrupted; nothing half-written was kept")
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place that turns failures into one line
        return _fail(exc, args.verbose)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _fail(exc: BaseException, verbose: bool) -> int:
    if verbose:
        for what in ("child_log", "child_traceback"):
            text = getattr(exc, what, "")
            if text:
                err.print(f"[dim]--- the stage process's {what.removeprefix('child_')} ---[/]\n{escape(text)}")
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
    from trtflow.flows import precheck
    from trtflow.pipelines.graph import build_graph
    from trtflow.pipelines.loader import load_pipeline

    loaded = load_pipeline(args.pipeline, args.overrides)
    graph = build_graph(loaded)
    precheck.check(loaded, graph)
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
    _print_code(loaded)
    out.print(f"[green]ok[/] {args.pipeline} is valid")
    return 0


def _print_code(loaded) -> None:
    """A pipeline file is code: what it will run besides trtflow, and the files it reads from outside its own
    directory (whose pictures and statistics may be published to a shared store), for whoever reviews it."""
    code = [(name, what) for name, spec in loaded.spec.stages.items() for what in spec.executes()]
    if not code:
        out.print("runs no code of its own: trtflow's stages only")
    else:
        out.print("runs this code besides trtflow's (review it as you review the pipeline file):")
        for name, what in code:
            out.print(f"  {escape(name)}: {escape(what)}")
    base = loaded.base_dir.resolve()
    outside = [(name, pattern) for name, spec in loaded.spec.stages.items()
               for pattern, _ in spec.data_globs().values() if not _glob_root(base, pattern).is_relative_to(base)]
    if outside:
        out.print(f"reads files outside {base}:")
        for name, pattern in outside:
            out.print(f"  {escape(name)}: {escape(pattern)}")


def _glob_root(base: Path, pattern: str) -> Path:
    """The directory a glob starts from: its parts before the first wildcard, resolved."""
    fixed = []
    for part in Path(pattern).parts:
        if any(c in part for c in "*?["):
            break
        fixed.append(part)
    return (base / Path(*fixed)).resolve() if fixed else base


def cmd_plan(args: argparse.Namespace) -> int:
    from trtflow.flows.runner import Runner
    from trtflow.flows.stores import open_store
    from trtflow.pipelines.loader import load_pipeline

    loaded = load_pipeline(args.pipeline, args.overrides)
    runner = Runner(loaded, store=open_store(_store_option(args.store) or loaded.store_location))
    for name in args.force or []:
        if name != "*":
            runner.check_stage_name(name, "--force")
    items = runner.plan(args.stages, args.force)
    errors = any(i.action == "error" for i in items)
    would_run = any(i.action == "run" for i in items)
    code = StageError.exit_code if errors else (CHECK_WOULD_RUN if args.check and would_run else 0)
    if args.json:
        sys.stdout.write(json.dumps({"pipeline": str(loaded.file), "store": runner.store.location,
                                     "stages": [{"stage": i.name, "kind": i.kind, "action": i.action,
                                                 "reason": i.reason, "key": i.key, "environment": i.environment,
                                                 "environment_changed": i.changed,
                                                 "executes": loaded.spec.stages[i.name].executes()}
                                                for i in items]}, indent=2) + "\n")
        return code
    table = Table(title=f"plan for {loaded.spec.name} (store: {runner.store.location})", title_justify="left")
    for col in ("stage", "kind", "action", "why", "key", "environment"):
        table.add_column(col, overflow="fold")
    style = {"reuse": "green", "run": "yellow", "error": "red"}
    for it in items:
        table.add_row(it.name, escape(it.kind), f"[{style[it.action]}]{it.action}[/]", escape(it.reason),
                      (it.key or "")[:12], it.environment)
    out.print(table)
    n_run = sum(i.action == "run" for i in items)
    out.print(f"{n_run} to run, {sum(i.action == 'reuse' for i in items)} reused")
    _print_code(loaded)
    return code


def _store_option(value: str | None) -> Path | str | None:
    """--store, resolved (a URL as given); a system directory is refused like the pipeline's `artifacts:`."""
    if not value:
        return None
    from trtflow.errors import SpecError
    from trtflow.pipelines.loader import is_url
    if is_url(value):
        return value
    from trtflow.pipelines.loader import unsafe_store_root

    root = Path(value).resolve()
    why = unsafe_store_root(root)
    if why:
        raise SpecError(f"--store {value}: {why}", hint="give a directory of its own")
    return root


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
    from trtflow.flows.runner import make_runner

    started = time.perf_counter()
    runner = make_runner(args.pipeline, args.overrides, str(_store_option(args.store) or "") or None)
    for name in args.force or []:
        if name != "*":
            runner.check_stage_name(name, "--force")
    runner.select(args.stages)
    reused = runner.reuse_all(args.stages, args.force)
    if reused is not None:  # nothing to run: no flow run, no Prefect start-up
        for o in reused:
            out.print(f"  {'[green]reused[/]':>20} [bold]{o.name}[/] ({escape(o.kind)}) {o.seconds:6.2f}s  key "
                      f"{o.key[:12]}  [dim]{escape(o.reason)}[/]")
        out.print(f"[green]done[/] {len(reused)} stages (0 ran, {len(reused)} reused) in "
                  f"{time.perf_counter() - started:.1f}s, no flow run needed; artifacts in {runner.store.location}")
        return 0

    from trtflow.flows import server

    api_url = None
    if server.wanted():
        with out.status("starting a Prefect server in the background ..."):
            api_url = server.ensure(on_start=lambda url: err.print(
                f"started a Prefect server in the background: {url.removesuffix('/api')} (its UI; "
                f"`trtflow server stop` stops it)"))

    from prefect import tags
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from trtflow.flows import pipeline_flow as pf

    if not args.verbose:
        _quiet_prefect_console()
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
        elif event == "skip":
            out.print(f"  [yellow]{'skipped':>9}[/] [bold]{name}[/] [dim](needs {escape(payload)}, which failed)[/]")

    def on_progress(what: str, done: int, total: int) -> None:
        status.update(f"{what} {done}/{total} ...")

    from trtflow import progress

    pf.LISTENERS.append(listen)
    progress.LISTENERS.append(on_progress)
    try:
        with tags(*pf.run_identity(args.pipeline)[1]), \
                temporary_settings(updates={PREFECT_API_URL: api_url} if api_url else {}):
            results = pf.pipeline_flow(pipeline_file=args.pipeline, overrides=args.overrides, stages=args.stages,
                                       force=args.force, store=runner.store.location)
    except RuntimeError as exc:
        if api_url and str(exc).startswith("Failed to reach API at"):
            raise PrefectUnavailable(f"trtflow's background Prefect server at {api_url} stopped answering during the "
                                     f"run; run again (a new one is started)") from None
        raise _prefect_unavailable(exc) or exc from None
    finally:
        status.stop()
        pf.LISTENERS.remove(listen)
        progress.LISTENERS.remove(on_progress)
    ran = sum(r["status"] == "ran" for r in results)
    out.print(f"[green]done[/] {len(results)} stages ({ran} ran, {len(results) - ran} reused) in "
              f"{time.perf_counter() - started:.1f}s; artifacts in {runner.store.location}")
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


def cmd_reduce(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from trtflow.errors import SpecError
    from trtflow.stages.bisect import reduce as rd
    from trtflow.stages.compare.gate import DEFAULTS
    from trtflow.stages.onnx import model_io

    model_path = Path(args.model)
    if not model_path.is_file():
        raise SpecError(f"{model_path}: no such file", hint="give the ONNX model that fails")
    if args.check == "command" and not args.check_command:
        raise SpecError("--check command needs --command CMD", hint="e.g. --command 'python repro.py {model}'")
    if args.qdq and args.check != "int8":
        raise SpecError("--qdq is for --check int8")
    shapes = {}
    for item in args.shapes:
        name, _, dims = item.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise SpecError(f"--shapes {item!r}: expected NAME=1x3x224x224") from None
    model = model_io.load(model_path)
    output = Path(args.output or f"{model_path.name.removesuffix('.onnx')}.reduced.onnx")
    work = Path(tempfile.mkdtemp(prefix="trtflow-reduce-"))
    status = err.status("reducing ...")
    status.start()
    try:
        feeds = rd.sample_feeds(model, model_path, Path(args.data) if args.data else None, shapes, args.samples,
                                args.seed)
        check = {"fp16": lambda: rd.fp16_check(args.bound or DEFAULTS["fp16"]["cosine"]),
                 "int8": lambda: rd.int8_check(args.bound or DEFAULTS["int8"]["cosine"],
                                               model_io.load(Path(args.qdq)) if args.qdq else None),
                 "parse": lambda: rd.tensorrt_check(build=False),
                 "build": lambda: rd.tensorrt_check(build=True),
                 "command": lambda: rd.command_check(args.check_command, args.timeout)}[args.check]()
        result = rd.reduce(model, check, feeds, work, progress=lambda m: err.print(f"  {escape(m)}"))
        staged = work / "reduced.onnx"
        model_io.save(result.model, staged, external=False)
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(staged, output)
    finally:
        status.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = {"model": str(model_path), "check": args.check, "output": str(output),
               "nodes_before": result.nodes_before, "nodes_after": len(result.nodes), "nodes": result.nodes,
               "inputs": [i.name for i in result.model.graph.input],
               "outputs": [o.name for o in result.model.graph.output], "failure": result.failure.message,
               "checks": result.checks, "seconds": result.seconds, "steps": result.steps}
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return 0
    out.print(f"[green]reduced[/] {result.nodes_before} -> {len(result.nodes)} nodes in {result.checks} checks "
              f"({result.seconds:.1f}s): {escape(', '.join(result.nodes[:10]))}"
              f"{' ...' if len(result.nodes) > 10 else ''}")
    out.print(f"  still fails: {escape(result.failure.message)}")
    out.print(f"  wrote {output}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from trtflow.flows.stores import open_store
    from trtflow.pipelines.loader import is_url

    if args.store:
        root = _store_option(args.store)
    elif args.pipeline:
        from trtflow.pipelines.loader import load_pipeline

        root = load_pipeline(args.pipeline, []).store_location
    else:
        root = Path(".trtflow")
    if not is_url(root) and not Path(root).is_dir():
        raise StoreError(f"no artifact store at {root}: give --store DIR or the pipeline file")
    started = time.perf_counter()
    result = open_store(root).verify(repair=args.repair)
    seconds = time.perf_counter() - started
    bad = [r for r in result["rows"] if r["status"] == "bad"]
    stale = [r for r in result["rows"] if r["status"] == "stale staging"]
    for r in bad:
        action = "removed" if args.repair else "bad"
        out.print(f"  [red]{action}[/] {escape(r['stage'])}/{escape(r['key'][:24])}: {escape(r['problem'])}")
    for r in stale:
        out.print(f"  [yellow]staging[/] {escape(r['stage'])}/{escape(r['key'])}: {escape(r['problem'])} "
                  f"({'removed' if args.repair else 'the next run removes it'})")
    foreign = [r for r in result["rows"] if r["status"] == "foreign"]
    for r in foreign:
        out.print(f"  [dim]left alone[/] {escape(r['stage'])}: {escape(r['problem'])}")
    ok = len(result["rows"]) - len(bad) - len(stale) - len(foreign)
    mb = result["bytes"] / 2**20
    out.print(f"{ok} results verified, {len(bad)} {'removed' if args.repair else 'bad'}; {mb:.1f} MB hashed in "
              f"{seconds:.2f}s ({mb / max(seconds, 1e-9):.0f} MB/s) in {root}")
    return 0 if not bad or args.repair else 1


def cmd_check_env(args: argparse.Namespace) -> int:
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


def cmd_server(args: argparse.Namespace) -> int:
    from trtflow.flows import server

    if args.action == "stop":
        rec = server.stop()
        out.print(f"stopped the Prefect server at {rec['url']} (pid {rec['pid']})" if rec else
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
    out.print(f"running at {rec['url']} (pid {rec['pid']}, log {rec['log']})")
    return 0


def cmd_init_deploy(args: argparse.Namespace) -> int:
    from importlib import resources

    from trtflow.errors import SpecError

    target = Path(args.output)
    if target.exists() and not args.force:
        raise SpecError(f"{target} exists", hint="give another -o, or --force to overwrite it")
    text = resources.files("trtflow.flows").joinpath("templates/prefect.yaml").read_text()
    target.write_text(text)
    out.print(f"wrote {target}: set TRTFLOW_GPU_KIND and TRTFLOW_MODELS, then `prefect --no-prompt deploy --all` "
              f"(the file's header says the rest)")
    return 0


def cmd_parse_trtexec(args: argparse.Namespace) -> int:
    from trtflow.errors import SpecError
    from trtflow.stages.trtexec.log import parse_log
    from trtflow.stages.trtexec.result import STAT_KEYS

    try:
        text = Path(args.log).read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise SpecError(f"{args.log}: cannot read it ({exc.strerror or exc})", hint="give a trtexec log file") \
            from None
    runs = parse_log(text)
    found = [r for r in runs if r.has_summary]
    chosen = (found or runs)[-1]
    if args.json:
        data = [r.to_json() for r in runs] if args.all else {**chosen.to_json(), "runs": len(runs)}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0 if found else 1
    for r in runs if args.all else [chosen]:
        head = f"TensorRT {r.tensorrt_version or '(version not printed)'} · {r.status or 'no status line'}"
        out.print(f"[bold]{escape(head)}[/]" + (f" · {len(runs)} runs, the last with a summary shown" if
                                                  len(runs) > 1 and not args.all else ""))
        if not r.has_summary:
            out.print(f"  [yellow]{escape(r.no_summary_reason())}[/]")
            continue
        stats = {k: getattr(r, k) for k in STAT_KEYS if getattr(r, k)}
        pcts = sorted({k for st in stats.values() for k in st if k.startswith("p")}, key=lambda k: float(k[1:]))
        columns = ["min", "mean", "median", "max", *pcts]
        table = Table(show_header=True)
        table.add_column("ms")
        for col in columns:
            table.add_column(col, justify="right")
        for key, st in stats.items():
            table.add_row(key.removesuffix("_ms"), *(f"{st[k]:g}" if k in st else "-" for k in columns))
        out.print(table)
        if r.throughput_qps is not None:
            out.print(f"  throughput {r.throughput_qps:g} qps")
        for w in r.warnings:
            out.print(f"  [yellow]warning:[/] {escape(w)}")
    return 0 if found else 1


COMMANDS = {"parse-trtexec": cmd_parse_trtexec, "run": cmd_run, "plan": cmd_plan, "validate": cmd_validate,
            "verify": cmd_verify, "reduce": cmd_reduce, "check-env": cmd_check_env, "init-deploy": cmd_init_deploy,
            "server": cmd_server,
            "schema": cmd_schema}

if __name__ == "__main__":
    raise SystemExit(main())
