"""`trtflow init`: write a first, commented pipeline file for a model (and its sample data), from what the model
and the data say; refuse, naming the flag to pass, what they do not say."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from trtflow.flows.cli.base import Command, out, write_file
from trtflow.pipelines.init import LAYOUTS, TASKS


class Init(Command):
    name = "init"
    help = "write a first pipeline.yaml for an ONNX model (and sample data): inputs, profiles, task metrics, stages"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("model", help="the ONNX model")
        parser.add_argument("--data", metavar="DIR|GLOB",
                            help="sample images (or .npy/.npz tensors): they size the profile's dynamic dimensions, "
                                 "feed every stage and calibrate an INT8 variant")
        parser.add_argument("--task", choices=TASKS,
                            help="how the outputs are judged, where their shapes do not say (other: element by "
                                 "element, by cosine)")
        parser.add_argument("--layout", choices=LAYOUTS, help="a detection head's layout, where its shape does not "
                                                              "say")
        parser.add_argument("--shape", dest="shapes", action="append", default=[], metavar="NAME=DIMS",
                            help="an input's profile, dimensions joined by 'x', each N or MIN:OPT:MAX, e.g. "
                                 "x=1:8:32x3x48x320 (repeatable)")
        parser.add_argument("--name", help="the pipeline's name (default: the model file's name)")
        parser.add_argument("-o", "--output", help="where to write it (default: pipeline.yaml beside the model); "
                                                   "never over an existing file")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.errors import SpecError
        from trtflow.pipelines.init.propose import default_output, propose
        from trtflow.pipelines.init.write import render

        model = Path(args.model)
        target = Path(args.output) if args.output else default_output(model)
        exists = f"give another -o, or remove {target}"
        if target.exists() or target.is_symlink():  # before reading anything: the write below checks again
            raise SpecError(f"{target} exists: init never overwrites a file", hint=exists)
        proposal = propose(model, out=target, command=_command(args), data=args.data, task=args.task,
                           layout=args.layout, shapes=args.shapes, name=args.name)
        write_file(target, render(proposal), exists_hint=exists)
        tasks = ", ".join(proposal.task.tasks()) or "none (outputs compared element by element)"
        out.print(f"wrote {target}: task {tasks}; check it with `trtflow validate {target}`, run it with "
                  f"`trtflow run {target}`")
        return 0


def _command(args: argparse.Namespace) -> str:
    words = ["trtflow", "init", args.model]
    for flag, value in (("--data", args.data), ("--task", args.task), ("--layout", args.layout),
                        ("--name", args.name), ("-o", args.output)):
        if value is not None:
            words += [flag, value]
    for shape in args.shapes:
        words += ["--shape", shape]
    return shlex.join(words)
