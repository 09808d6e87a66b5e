"""`trtflow init-deploy`: write the prefect.yaml of the watcher deployments (schedule, event trigger, work pool
per GPU kind) into a model repo."""
from __future__ import annotations

import argparse
from pathlib import Path

from trtflow.flows.cli.base import Command, out


class InitDeploy(Command):
    name = "init-deploy"
    help = (
        "write the prefect.yaml of the watcher deployments (schedule, event trigger, work pool per GPU kind) into a "
        "model repo")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", default="prefect.yaml",
                            help="where to write it (default: ./prefect.yaml)")
        parser.add_argument("--force", action="store_true", help="overwrite an existing file")

    def run(self, args: argparse.Namespace) -> int:
        from importlib import resources

        from trtflow.errors import SpecError

        target = Path(args.output)
        if target.exists() and not args.force:
            raise SpecError(f"{target} exists", hint="give another -o, or --force to overwrite it")
        text = resources.files("trtflow.flows").joinpath("templates/prefect.yaml").read_text()
        target.write_text(text)
        out.print(f"wrote {target}: set TRTFLOW_GPU_KIND and TRTFLOW_MODELS, then `prefect --no-prompt deploy --all` "
                  f"(the file's header says the rest)")
        return 0

