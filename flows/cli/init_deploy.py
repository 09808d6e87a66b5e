"""`trtflow init-deploy`: write the prefect.yaml of this machine's watcher deployment (schedule, event trigger,
its own work queue in the pool of its GPU kind) into a model repo, and create the concurrency limits that keep a
benchmark alone on each of its GPUs."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from rich.markup import escape

from trtflow.flows.cli.base import Command, out, write_file
from trtflow.yaml_text import checked, comment_text, visible


class InitDeploy(Command):
    name = "init-deploy"
    help = ("write the prefect.yaml of this machine's watcher deployment (schedule, event trigger, its own work "
            "queue) into a model repo, and create its GPUs' concurrency limits on the Prefect server")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", help="where to write it (default: ./prefect-<machine>.yaml)")
        parser.add_argument("--machine", help="the machine's name (default: $TRTFLOW_MACHINE, else the host name: "
                                              "what check-env sends)")
        parser.add_argument("--gpu-kind", help="its GPU kind, the work pool's suffix (default: $TRTFLOW_GPU_KIND, "
                                               "else the first GPU's name as a slug, else cpu)")
        parser.add_argument("--limits", action="store_true",
                            help="also create a concurrency limit of 1 per GPU of this machine on the Prefect "
                                 "server (tag gpu:<machine>:<device>), so that no two stages of any runs share it")
        parser.add_argument("--force", action="store_true", help="overwrite an existing file")

    def run(self, args: argparse.Namespace) -> int:
        from importlib import resources

        from trtflow import settings
        from trtflow.errors import SpecError
        from trtflow.flows import machine

        check = machine.check(None) if not (args.machine and args.gpu_kind) else None
        name = args.machine or machine.machine_name()
        kind = args.gpu_kind or (check.kind if check else "cpu")
        for what, value in (("--machine", name), ("--gpu-kind", kind)):
            if not settings.LABEL.fullmatch(value):
                raise SpecError(f"{what} '{value}' is not a name Prefect work pools and queues take",
                                hint="letters, digits, '.', '_' and '-' only")
        target = Path(args.output or f"prefect-{name}.yaml")
        text = resources.files("trtflow.flows").joinpath("templates/prefect.yaml").read_text()
        # the names are labels (checked above); the file's own name is the user's text, shown only in a comment
        text = text.replace("@MACHINE@", name).replace("@KIND@", kind)
        write_file(target, checked(text.replace("@FILE@", comment_text(shlex.quote(target.name)))), force=args.force)
        shown = escape(visible(str(target))), escape(visible(shlex.quote(target.name)))
        out.print(f"wrote {shown[0]} for machine {name} (GPU kind {kind}): set TRTFLOW_MODELS, then `prefect "
                  f"--no-prompt deploy --all --prefect-file {shown[1]}` (the file's header says the rest)")
        if args.limits:
            for tag in machine.create_gpu_limits(name, check):
                out.print(f"concurrency limit 1 on tag {tag}")
        return 0


COMMAND = InitDeploy()
