"""`trtflow plan`: show, per stage, reused or stale and why."""
from __future__ import annotations

import argparse
import json
import sys

from rich.markup import escape
from rich.table import Table

from trtflow.decisions import of
from trtflow.errors import StageError
from trtflow.flows.cli.base import (
    CHECK_WOULD_RUN,
    Command,
    add_pipeline_arguments,
    add_selection_arguments,
    out,
    print_code,
    store_option,
)


class Plan(Command):
    name = "plan"
    help = "show, per stage, reused or stale and why"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_pipeline_arguments(parser)
        add_selection_arguments(parser)
        parser.add_argument("--json", action="store_true", help="print the plan as JSON (per stage: action, reason, "
                            "key, environment and the environment fields that changed)")
        parser.add_argument("--check", action="store_true", help="exit 0 when nothing would run, 3 when something "
                            "would (for cron jobs and pre-commit hooks)")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.flows.runner import Runner
        from trtflow.flows.stores import open_store
        from trtflow.pipelines.loader import load_pipeline

        loaded = load_pipeline(args.pipeline, args.overrides)
        runner = Runner(loaded, store=open_store(store_option(args.store) or loaded.store_location))
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
                                                     "executes": loaded.spec.stages[i.name].executes(),
                                                     "excluded": {d.subject: d.why
                                                                  for d in of(i.decisions, "excluded")},
                                                     "held": [{"model": d.model, "target": d.subject,
                                                               "version": d.version, "engine": d.engine, "why": d.why}
                                                              for d in of(i.decisions, "held")]}
                                                    for i in items]}, indent=2) + "\n")
            return code
        table = Table(title=f"plan for {loaded.spec.name} (store: {runner.store.location})", title_justify="left")
        for col in ("stage", "kind", "action", "why", "key", "environment"):
            table.add_column(col, overflow="fold")
        style = {"reuse": "green", "run": "yellow", "error": "red"}
        for it in items:
            why = "; ".join([it.reason]
                            + [f"left out optional variant {d.subject}" for d in of(it.decisions, "excluded")]
                            + [f"kept version {d.version} for target {d.subject}" for d in of(it.decisions, "held")])
            table.add_row(it.name, escape(it.kind), f"[{style[it.action]}]{it.action}[/]", escape(why),
                          (it.key or "")[:12], it.environment)
        out.print(table)
        n_run = sum(i.action == "run" for i in items)
        out.print(f"{n_run} to run, {sum(i.action == 'reuse' for i in items)} reused")
        print_code(loaded)
        return code


COMMAND = Plan()
