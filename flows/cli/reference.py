"""`trtflow reference`: write the reference of every pipeline option (docs/reference.md), generated from the
parameter models by `trtflow.pipelines.reference`."""
from __future__ import annotations

import argparse

from trtflow.flows.cli.base import Command, add_output_arguments, print_or_write


class Reference(Command):
    name = "reference"
    help = "print the reference of every pipeline option in Markdown (docs/reference.md)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_output_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.pipelines.reference import render

        print_or_write(render(), args)
        return 0


COMMAND = Reference()
