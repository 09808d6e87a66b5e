"""`trtflow schema`: print the pipeline JSON Schema (for editors)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtflow.flows.cli.base import Command, out


class Schema(Command):
    name = "schema"
    help = "print the pipeline JSON Schema (for editors)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", help="write to this file instead of stdout")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.pipelines.pipeline import json_schema

        text = json.dumps(json_schema(), indent=2)
        if args.output:
            Path(args.output).write_text(text + "\n")
            out.print(f"wrote {args.output}")
        else:
            sys.stdout.write(text + "\n")
        return 0

