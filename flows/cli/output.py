"""`trtflow output`: where a stage's up-to-date result is, for scripts (a Triton server's model repository, a
report to attach)."""
from __future__ import annotations

import argparse

from trtflow.errors import SpecError
from trtflow.flows.cli.base import Command, add_pipeline_arguments, err, out, store_option


class Output(Command):
    name = "output"
    help = "print the path of a stage's up-to-date result, or of one of its outputs"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_pipeline_arguments(parser)
        parser.add_argument("stage", help="the stage's name in the pipeline")
        parser.add_argument("output", nargs="?", help="one of its outputs (default: the result's directory)")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.flows.results import Verdict
        from trtflow.flows.runner import Runner
        from trtflow.flows.stores import open_store
        from trtflow.pipelines.loader import load_pipeline

        loaded = load_pipeline(args.pipeline, args.overrides)
        runner = Runner(loaded, store=open_store(store_option(args.store) or loaded.store_location))
        runner.check_stage_name(args.stage, "stage")
        item = next(i for i in runner.plan([args.stage]) if i.name == args.stage)
        manifest = runner.store.lookup(args.stage, item.key).manifest if item.action == "reuse" else None
        if manifest is None:
            raise SpecError(f"stage '{args.stage}' has no up-to-date result in {runner.store.location} "
                            f"({item.reason})", hint=f"run it first: trtflow run {args.pipeline} --stage {args.stage}")
        directory = runner.store.path(args.stage, item.key)
        if args.output is not None and args.output not in manifest.outputs:
            raise SpecError(f"stage '{args.stage}' has no output '{args.output}'",
                            hint=f"its outputs: {', '.join(manifest.outputs)}")
        for d in Verdict.of(manifest).decisions:  # reused only while no later version was released (plan says)
            if d.action in ("released", "held"):
                err.print(f"{d.model} version {d.version} for target {d.subject}: the latest released"
                          + (f" (kept: {d.why})" if d.action == "held" else ""), markup=False)
        if args.output is None:
            out.print(str(directory))
            return 0
        out.print(str(directory / manifest.outputs[args.output].path))
        return 0


COMMAND = Output()
