"""`trtflow schema`: print the pipeline JSON Schema (for editors)."""
from __future__ import annotations

import argparse
import json

from trtflow.flows.cli.base import Command, add_output_arguments, print_or_write


class Schema(Command):
    name = "schema"
    help = "print the pipeline JSON Schema (for editors)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_output_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.pipelines.pipeline import json_schema

        print_or_write(json.dumps(json_schema(), indent=2) + "\n", args)
        return 0


COMMAND = Schema()
