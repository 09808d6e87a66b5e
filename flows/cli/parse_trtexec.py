"""`trtflow parse-trtexec`: read a trtexec log into numbers (exit 0: a performance summary was found, 1: none)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from trtflow.flows.cli.base import Command, out

if TYPE_CHECKING:
    from trtflow.stages.trtexec.result import PerfResult


class ParseTrtexec(Command):
    name = "parse-trtexec"
    help = "read a trtexec log into numbers (exit 0: a performance summary was found, 1: none)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("log", help="trtexec's text output (any TensorRT version; prefixed or indented lines "
                                         "are fine)")
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
        parser.add_argument("--all", action="store_true", help="every run of a log that holds several (a JSON list)")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.errors import SpecError
        from trtflow.stages.trtexec.log import parse_log

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
        elif args.all:
            for r in runs:
                _print_run(r, "")
        else:
            _print_run(chosen, f" · {len(runs)} runs, the last with a summary shown" if len(runs) > 1 else "")
        return 0 if found else 1


def _print_run(r: PerfResult, note: str) -> None:
    """One run of the log: its TensorRT and status line (and `note`), its timing table, throughput and warnings."""
    head = f"TensorRT {r.tensorrt_version or '(version not printed)'} · {r.status or 'no status line'}"
    out.print(f"[bold]{escape(head)}[/]" + note)
    if not r.has_summary:
        out.print(f"  [yellow]{escape(r.no_summary_reason())}[/]")
        return
    out.print(_stats_table(r))
    if r.throughput_qps is not None:
        out.print(f"  throughput {r.throughput_qps:g} qps")
    for w in r.warnings:
        out.print(f"  [yellow]warning:[/] {escape(w)}")


def _stats_table(r: PerfResult) -> Table:
    """The run's timing statistics in milliseconds: a row per statistic trtexec printed, a column per figure."""
    from trtflow.stages.trtexec.result import STAT_KEYS

    stats = {k: getattr(r, k) for k in STAT_KEYS if getattr(r, k)}
    pcts = sorted({k for st in stats.values() for k in st if k.startswith("p")}, key=lambda k: float(k[1:]))
    columns = ["min", "mean", "median", "max", *pcts]
    table = Table(show_header=True)
    table.add_column("ms")
    for col in columns:
        table.add_column(col, justify="right")
    for key, st in stats.items():
        table.add_row(key.removesuffix("_ms"), *(f"{st[k]:g}" if k in st else "-" for k in columns))
    return table

COMMAND = ParseTrtexec()
