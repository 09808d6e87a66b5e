"""What every command shares: the consoles, the `Command` base class, the argument groups several commands take,
and the store option. A command module keeps its heavy imports (Prefect, ONNX, numpy) inside `run`, so
`trtflow validate` and `--help` start in a fraction of a second."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import ClassVar

from rich.console import Console
from rich.markup import escape

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

CHECK_WOULD_RUN = 3  # `plan --check`, `check-env`: something would run / changed


class Command:
    """One `trtflow` subcommand: its name and help, its arguments, and what it does (an exit code)."""

    name: ClassVar[str]
    help: ClassVar[str]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pipeline", help="the pipeline YAML file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a value, e.g. --set stages.build.workspace=2GiB (repeatable)")
    parser.add_argument("--store", help="artifact store root (default: the pipeline's 'artifacts:' or .trtflow/)")


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", dest="stages", action="append", metavar="NAME",
                        help="run only this stage and what it depends on (repeatable)")
    parser.add_argument("--force", action="append", nargs="?", const="*", metavar="NAME",
                        help="re-run even if cached: every selected stage, or the one named (repeatable)")


def store_option(value: str | None) -> Path | str | None:
    """--store, resolved (a URL as given); a system directory is refused like the pipeline's `artifacts:`."""
    if not value:
        return None
    from trtflow.errors import SpecError
    from trtflow.pipelines.loader import NO_SECRET_IN_URL, STORE_CREDENTIALS_HINT, is_url, unsafe_store_root
    from trtflow.secrets import holds_secret

    if is_url(value) and holds_secret(value):
        raise SpecError(f"--store: the URL given holds a secret (not repeated here): {NO_SECRET_IN_URL}",
                        hint=STORE_CREDENTIALS_HINT)
    if is_url(value):
        return value
    root = Path(value).resolve()
    why = unsafe_store_root(root)
    if why:
        raise SpecError(f"--store {value}: {why}", hint="give a directory of its own")
    return root


def print_code(loaded) -> None:  # noqa: ANN001 - a LoadedPipeline
    """A pipeline file is code: what it will run besides trtflow, and the files it reads from outside its own
    directory (whose pictures and statistics may be published to a shared store), for whoever reviews it."""
    code = [(name, what) for name, spec in loaded.spec.stages.items() for what in spec.executes()]
    if not code:
        out.print("runs no code of its own: trtflow's stages only")
    else:
        out.print("runs this code besides trtflow's (review it as you review the pipeline file):")
        for name, what in code:
            out.print(f"  {escape(name)}: {escape(what)}")
    base = loaded.base_dir.resolve()
    outside = [(name, pattern) for name, spec in loaded.spec.stages.items()
               for pattern, _ in spec.data_globs().values() if not _glob_root(base, pattern).is_relative_to(base)]
    if outside:
        out.print(f"reads files outside {base}:")
        for name, pattern in outside:
            out.print(f"  {escape(name)}: {escape(pattern)}")


def _glob_root(base: Path, pattern: str) -> Path:
    """The directory a glob starts from: its parts before the first wildcard, resolved."""
    fixed = []
    for part in Path(pattern).parts:
        if any(c in part for c in "*?["):
            break
        fixed.append(part)
    return (base / Path(*fixed)).resolve() if fixed else base


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", help="write to this file instead of stdout (never over an existing file "
                                               "but with --force, never through a symbolic link)")
    parser.add_argument("--force", action="store_true", help="with -o: overwrite an existing file")


def print_or_write(text: str, args: argparse.Namespace) -> None:
    """A generated file (`trtflow schema`, `trtflow reference`): to stdout, or to `-o` through `write_file`."""
    if args.output:
        write_file(Path(args.output), text, force=args.force)
        out.print(f"wrote {escape(args.output)}")
    else:
        sys.stdout.write(text)


def write_file(target: Path, text: str, *, force: bool = False,
               exists_hint: str = "give another -o, or --force to overwrite it") -> None:
    """`text` into `target`, whole or not at all: never through a symbolic link there (dangling or not: it points
    anywhere), never over a directory, over an existing file only with `force`. Written beside it first, then
    linked into place (refused if something appeared there meanwhile) or, with `force`, renamed over it."""
    from trtflow.errors import SpecError

    if target.is_symlink():  # O_EXCL alone would call a dangling one "exists"
        raise SpecError(f"{target} is a symbolic link: not written through", hint="give -o a path that is not a link")
    if target.is_dir():
        raise SpecError(f"{target} is a directory", hint="give -o the path of a file")
    if target.exists() and not force:
        raise SpecError(f"{target} exists", hint=exists_hint)
    folder = target.parent if str(target.parent) else Path(".")
    try:
        fd, staged = tempfile.mkstemp(prefix=f".{target.name[:64]}.", suffix=".partial", dir=folder)
    except OSError as exc:
        raise SpecError(f"cannot write {target}: {exc.strerror}", hint="check the folder exists and is "
                                                                       "writable") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(staged, 0o644)
        if force:
            os.replace(staged, target)  # replaces a link or file there itself, never what a link points to
        else:
            try:
                os.link(staged, target)
            except FileExistsError:
                raise SpecError(f"{target} exists", hint=exists_hint) from None
            except OSError:  # a file system without hard links: checked above, a moment ago
                os.replace(staged, target)
    except OSError as exc:
        raise SpecError(f"cannot write {target}: {exc.strerror}") from None
    finally:
        if os.path.lexists(staged):
            os.unlink(staged)
