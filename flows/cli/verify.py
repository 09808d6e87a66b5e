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

        if args.store:
            root = store_option(args.store)
        elif args.pipeline:
            from trtflow.pipelines.loader import load_pipeline

            root = load_pipeline(args.pipeline, []).store_location
        else:
            root = Path(".trtflow")
        if not is_url(root) and not Path(root).is_dir():
            raise StoreError(f"no artifact store at {root}: give --store DIR or the pipeline file")
        started = time.perf_counter()
        result = open_store(root).verify(repair=args.repair)
        seconds = time.perf_counter() - started
        bad = result.having(VerifyStatus.BAD)
        stale = result.having(VerifyStatus.STALE_STAGING)
        for r in bad:
            action = "removed" if args.repair else "bad"
            out.print(f"  [red]{action}[/] {escape(r.stage)}/{escape(r.key[:24])}: {escape(r.problem or '')}")
        for r in stale:
            out.print(f"  [yellow]staging[/] {escape(r.stage)}/{escape(r.key)}: {escape(r.problem or '')} "
                      f"({'removed' if args.repair else 'the next run removes it'})")
        foreign = result.having(VerifyStatus.FOREIGN)
        for r in foreign:
            out.print(f"  [dim]left alone[/] {escape(r.stage)}: {escape(r.problem or '')}")
        ok = len(result.having(VerifyStatus.OK))
        mb = result.bytes / 2**20
        out.print(f"{ok} results verified, {len(bad)} {'removed' if args.repair else 'bad'}; {mb:.1f} MB hashed in "
                  f"{seconds:.2f}s ({mb / max(seconds, 1e-9):.0f} MB/s) in {root}")
        return 0 if not bad or args.repair else 1


COMMAND = Verify()
