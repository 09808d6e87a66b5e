"""`trtflow verify`: re-hash every stored result against its manifest (--repair drops what differs)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.markup import escape

from trtflow.errors import StoreError
from trtflow.flows.cli.base import Command, out, store_option


class Verify(Command):
    name = "verify"
    help = "re-hash every stored result against its manifest (--repair drops what differs)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("pipeline", nargs="?", help="a pipeline file: verify its store (default: --store)")
        parser.add_argument("--store", help="artifact store root (default: the pipeline's, else .trtflow/)")
        parser.add_argument("--repair", action="store_true", help="remove results that do not match and staging of "
                            "dead runs (the next run recomputes)")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.flows.store import VerifyStatus
        from trtflow.flows.stores import open_store
        from trtflow.pipelines.loader import is_url

        root = _root(args)
        if not is_url(root) and not Path(root).is_dir():
            raise StoreError(f"no artifact store at {root}: give --store DIR or the pipeline file")
        started = time.perf_counter()
        result = open_store(root).verify(repair=args.repair)
        seconds = time.perf_counter() - started
        bad = result.having(VerifyStatus.BAD)
        dropped = "removed" if args.repair else "bad"  # what became of a result that does not match
        for r in bad:
            out.print(f"  [red]{dropped}[/] {escape(r.stage)}/{escape(r.key[:24])}: {escape(r.problem or '')}")
        for r in result.having(VerifyStatus.STALE_STAGING):
            out.print(f"  [yellow]staging[/] {escape(r.stage)}/{escape(r.key)}: {escape(r.problem or '')} "
                      f"({'removed' if args.repair else 'the next run removes it'})")
        for r in result.having(VerifyStatus.FOREIGN):
            out.print(f"  [dim]left alone[/] {escape(r.stage)}: {escape(r.problem or '')}")
        ok = len(result.having(VerifyStatus.OK))
        mb = result.bytes / 2**20
        out.print(f"{ok} results verified, {len(bad)} {dropped}; {mb:.1f} MB hashed in "
                  f"{seconds:.2f}s ({mb / max(seconds, 1e-9):.0f} MB/s) in {root}")
        return 0 if not bad or args.repair else 1


def _root(args: argparse.Namespace) -> Path | str | None:
    """The store to verify: --store, else the pipeline file's, else .trtflow/."""
    if args.store:
        return store_option(args.store)
    if args.pipeline:
        from trtflow.pipelines.loader import load_pipeline

        return load_pipeline(args.pipeline, []).store_location
    return Path(".trtflow")

COMMAND = Verify()
