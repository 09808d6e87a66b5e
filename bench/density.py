"""Decisions per line (issue #70): branch points per 100 code lines, for trtflow's folders and for anchor projects.

The rule, so the count can be reproduced (every `*.py` file under a folder, parsed with `ast` by the running Python):

- branch points, one each: an `if` statement (an `elif` is an `if` of its own), a `for` / `async for` / `while`
  loop, an `except` handler (`except*` too), a `match` case, a ternary (`a if c else b`), and each `if` filter of a
  comprehension; an `and` / `or` chain of n operands counts n - 1 (`a and (b or c)` counts 2). Not counted: `with`,
  `assert`, `try` itself, `else` / `finally`, a loop's `else`, `return` / `break` / `continue`, calls.
- code lines: the lines holding a token that is not a comment, a blank line or a docstring (the string that opens a
  module, class or function body); a line with code and a comment is a code line; every line of a multi-line
  expression or of a string that is not a docstring is one.
- per 100 lines: 100 * branch points / code lines, per row; `in expr`: the branch points that are and/or operands,
  ternaries and comprehension filters; the anchors' median is the median of their rows' densities.

    python bench/density.py [--before 9efe7f6] [--anchor polygraphy=/path/to/polygraphy ...]

trtflow's rows are `flows/`, `stages/release/` and the whole product (`trtflow/ pipelines/ flows/ stages/`), read from
the files on disk (HEAD plus uncommitted edits) and, with --before REV, from that commit (`git archive` into a
temporary folder; the repository is not touched). Anchors are folders given on the command line; nothing is stored.
"""
from __future__ import annotations

import argparse
import ast
import io
import statistics
import subprocess
import tarfile
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("trtflow", "pipelines", "flows", "stages")
ROWS = (("flows/", ("flows",)), ("stages/release/", ("stages/release",)),
        ("trtflow/ pipelines/ flows/ stages/", PRODUCT))
ONE_EACH = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.match_case)
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
            tokenize.ENCODING}


@dataclass
class Count:
    files: int = 0
    lines: int = 0
    branches: int = 0
    in_expr: int = 0
    unparsed: int = 0

    def add(self, other: Count) -> None:
        self.files += other.files
        self.lines += other.lines
        self.branches += other.branches
        self.in_expr += other.in_expr
        self.unparsed += other.unparsed

    @property
    def density(self) -> float:
        return 100 * self.branches / self.lines if self.lines else 0.0


def branch_points(tree: ast.AST) -> tuple[int, int]:
    """(statement branch points, expression branch points) of a parsed file, by the rule above."""
    statements = expressions = 0
    for node in ast.walk(tree):
        if isinstance(node, ONE_EACH):
            statements += 1
        elif isinstance(node, ast.BoolOp):
            expressions += len(node.values) - 1
        elif isinstance(node, ast.IfExp):
            expressions += 1
        elif isinstance(node, ast.comprehension):
            expressions += len(node.ifs)
    return statements, expressions


def docstring_spans(tree: ast.AST) -> dict[int, list[tuple[tuple[int, int], tuple[int, int]]]]:
    """The docstrings' (start, end) positions, by each line they cover."""
    spans: dict[int, list[tuple[tuple[int, int], tuple[int, int]]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            span = ((first.lineno, first.col_offset), (first.end_lineno or first.lineno, first.end_col_offset or 0))
            for line in range(span[0][0], span[1][0] + 1):
                spans.setdefault(line, []).append(span)
    return spans


def code_lines(source: str, tree: ast.AST) -> int:
    """Lines holding a token that is neither a comment, layout nor part of a docstring."""
    docs = docstring_spans(tree)
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in NOT_CODE:
            continue
        if any(start <= token.start < end for start, end in docs.get(token.start[0], ())):
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines)


def count_file(path: Path) -> Count:
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(source)
        lines = code_lines(source, tree)
    except (SyntaxError, tokenize.TokenError):
        return Count(unparsed=1)
    statements, expressions = branch_points(tree)
    return Count(files=1, lines=lines, branches=statements + expressions, in_expr=expressions)


def count_folders(base: Path, folders: tuple[str, ...]) -> Count:
    total = Count()
    for folder in folders:
        for path in sorted((base / folder).rglob("*.py")):
            total.add(count_file(path))
    return total


def extract(rev: str, into: Path) -> None:
    """The product's folders at commit REV, from `git archive` (read-only for the repository)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *PRODUCT], check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")


def row(folder: str, tree: str, count: Count, median: float | None) -> str:
    ratio = f"{count.density / median:.2f}x" if median else ""
    return (f"| {folder} | {tree} | {count.files} | {count.lines} | {count.branches} | {count.in_expr} | "
            f"{count.density:.1f} | {ratio} |")


def table(trees: list[tuple[str, Path]], anchors: dict[str, Path]) -> list[str]:
    anchor_counts = {name: count_folders(path, (".",)) for name, path in anchors.items()}
    median = statistics.median(c.density for c in anchor_counts.values()) if anchor_counts else None
    out = ["| folder | tree | files | code lines | branch points | in expr | per 100 lines | x anchors' median |",
           "|---|---|---|---|---|---|---|---|"]
    for folder, folders in ROWS:
        out += [row(folder, tree, count_folders(base, folders), median) for tree, base in trees]
    out += [row(name, "anchor", count, None) for name, count in anchor_counts.items()]
    unparsed = sum(c.unparsed for c in anchor_counts.values())
    if median is not None:
        out.append(f"\nanchors' median: {median:.1f} per 100 lines ({len(anchor_counts)} anchors; "
                   f"{unparsed} anchor file(s) this Python could not parse, left out)")
    return out


def anchor_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"expected NAME=FOLDER with an existing folder, got {text!r}")
    return name, Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="REV", help="also count trtflow at this commit")
    parser.add_argument("--anchor", action="append", type=anchor_arg, default=[], metavar="NAME=FOLDER")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="density-") as tmp:
        trees = [("now", ROOT)]
        if args.before:
            extract(args.before, Path(tmp))
            trees.insert(0, (args.before, Path(tmp)))
        print("\n".join(table(trees, dict(args.anchor))))


if __name__ == "__main__":
    main()
