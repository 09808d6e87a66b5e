"""`trtflow` (after flows/cli/__init__.py's no-op check): one module per command (`flows/cli/<command>.py`, a
`Command` each), listed in `COMMANDS`; this module builds the parser of the command named (importing its module
alone) and turns every failure into one line on stderr and a non-zero exit code (`--verbose` adds the traceback)."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from pathlib import Path

from rich.markup import escape

from trtflow import phases, settings
from trtflow.disk import disk_error
from trtflow.errors import TrtflowError
from trtflow.flows.cli.base import Command, err
from trtflow.yaml_text import visible

# `trtflow <name>` runs flows/cli/<name, - as _>.py's COMMAND; listed in the order `--help` shows them
COMMANDS = ("init", "run", "plan", "validate", "verify", "output", "reduce", "parse-trtexec", "check-env",
            "init-deploy", "server", "schema", "reference")


def command(name: str) -> Command:
    return importlib.import_module(f"trtflow.flows.cli.{name.replace('-', '_')}").COMMAND


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: the arguments of the command it names only (the other commands' modules are not
    imported); of every command when it names none it knows (`--help`, a typo: argparse lists them all)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and Prefect's logs")
    ap = argparse.ArgumentParser(prog="trtflow", parents=[common],
                                 description="Declarative ONNX -> TensorRT pipelines, run as Prefect flows.")
    sub = ap.add_subparsers(dest="command", required=True)
    named = next((a for a in argv or () if not a.startswith("-")), None)
    for c in map(command, [named] if named in COMMANDS else COMMANDS):
        c.add_arguments(sub.add_parser(c.name, parents=[common], help=c.help))
    return ap


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or `kill` ending the run): unwound like Ctrl-C, so stages' processes are killed and
    staging is removed on the way out."""


def _terminate(signum, frame) -> None:  # noqa: ANN001 - a signal handler
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser(argv).parse_args(argv)
    phases.add("trtflow start-up: interpreter, CLI imports", phases.since_process_start())
    args.argv = argv  # as typed: the no-op record's key (flows/noop.py)
    chosen = command(args.command)
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        settings.check_all()  # a bad TRTFLOW_* value is found before anything starts, not when first read
        return chosen.run(args)
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
        failure = exc.failure if isinstance(exc, TrtflowError) else None
        for what, text in (("log", failure.log), ("traceback", failure.traceback)) if failure else ():
            if text:
                err.print(f"[dim]--- the stage process's {what} ---[/]\n{escape(text)}")
        err.print_exception(show_locals=False)
    if not isinstance(exc, TrtflowError):
        exc = disk_error(exc, Path.cwd()) or exc
    known = isinstance(exc, TrtflowError)
    message = str(exc) if known else f"{type(exc).__name__}: {exc}"
    err.print(f"[bold red]error:[/] {escape(visible(message))}", markup=True, soft_wrap=True)
    if not known and not verbose:
        err.print("(unexpected: run again with --verbose for the traceback)")
    return exc.exit_code if known else 1
