"""`trtflow validate`: check the pipeline file only (fast, no Prefect)."""
from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from trtflow.flows.cli.base import Command, add_pipeline_arguments, out, print_code


class Validate(Command):
    name = "validate"
    help = "check the pipeline file only (fast, no Prefect)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_pipeline_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
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
        print_code(loaded)
        out.print(f"[green]ok[/] {args.pipeline} is valid")
        return 0


COMMAND = Validate()
