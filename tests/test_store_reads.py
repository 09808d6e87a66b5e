"""Every read of the store's own files goes through `trtflow/files.py` (issue #37): a plain `read_text()`,
`read_bytes()` or `open()` of a FIFO put where a store file belongs blocks for ever, of a symlink to /dev/zero
never ends. The source of trtflow is searched for plain reads; each one left must be allowed below, for a reason
that makes it no read of the store's own files (engine and timing caches, records, anything under shared/)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("trtflow", "flows", "stages")

OWN = "what this process, or a child it started, just wrote in its own output, staging directory or log"
USER = "a file the user names: the pipeline file, a data file, a log given on the command line"
INPUT = ("a file of a published result given to the stage (or shown from one), verified against its manifest by "
         "files.sha256 (regular files only) before it is used")
PACKAGE = "trtflow's own package data"

ALLOWED: dict[tuple[str, str], str] = {  # (file, function): why its plain read is no read of the store's own files
    ("trtflow/usercode.py", "package_sources"): USER,  # the source of an installed kind of the user's, to key it
    ("trtflow/child.py", "call"): OWN,  # the child's response, in the folder the caller made for it
    ("trtflow/child.py", "serve"): OWN,  # the request the parent wrote just before starting this child
    ("flows/isolate.py", "_Tail.run"): OWN,
    ("flows/isolate.py", "_answer"): OWN,  # a crashed stage process's log
    ("flows/isolate.py", "_wind_up"): OWN,
    ("trtflow/phases.py", "recorded"): OWN,  # the benches' and tests' record of phases and passes (TRTFLOW_PHASES)
    ("flows/server.py", "_start"): OWN,  # the log of the Prefect server this process started
    ("flows/store.py", "LocalStore.publish"): OWN,  # opened to fsync the staging this run wrote, not read
    ("stages/benchmark/stage.py", "_trtexec"): OWN,  # trtexec's output, which this process redirected there
    ("stages/release/card.py", "write"): OWN,  # the plots the release stage drew
    ("stages/release/card.py", "_image"): OWN,
    ("stages/parity/report.py", "ParityReport.summary"): OWN,  # the picture the parity stage drew
    ("flows/run_identity.py", "run_identity"): USER,
    # the no-op record (trtflow's state directory, not a store) and the machine's version files, read with the
    # standard library only: the no-op answer imports nothing else
    ("flows/noop.py", "answer"): "the no-op record in trtflow's state directory",
    ("flows/noop.py", "machine"): "the driver's, CUDA's and the OS's version files (/proc, /usr/local/cuda, /etc)",
    ("flows/noop.py", "post"): "the no-op record in trtflow's state directory",
    ("flows/watch.py", "_is_pipeline"): USER,
    ("flows/cli/parse_trtexec.py", "ParseTrtexec.run"): USER,
    ("stages/compare/labels.py", "read_pairs"): USER,  # validate's labels file (a regular file the data glob took)
    ("stages/validate/labelling.py", "LabelSet._charset"): USER,  # its charset file, likewise
    ("stages/compare/label_boxes.py", "read_coco"): USER,  # its COCO instances file, likewise
    ("flows/cli/init_deploy.py", "InitDeploy.run"): PACKAGE,
    ("stages/release/triton/preprocess.py", "vendored_sources"): PACKAGE,  # trtflow's preprocessing modules, copied
    ("flows/code_lock.py", "file_digest"): PACKAGE,  # trtflow's own sources and the lock beside them
    ("flows/code_lock.py", "_parsed"): PACKAGE,
    ("flows/code_lock.py", "stage_version"): PACKAGE,  # a stage module's source, for its VERSION
    ("flows/code_lock.py", "_read"): PACKAGE,
    ("flows/code_lock.py", "main"): PACKAGE,
    ("flows/runner.py", "StageOutcome.summary"): INPUT,  # summary.md of a result the runner verified
    ("stages/image/preprocess.py", "load"): INPUT,
    ("stages/release/stage.py", "run"): INPUT,
    ("stages/release/stage.py", "_higher_precision"): INPUT,
    ("stages/release/stage.py", "_parity"): INPUT,
    ("stages/release/stage.py", "_prepared"): INPUT,  # prepare's report
    ("stages/trt/partition.py", "_supports"): OWN,  # the model the partition's caller wrote in its work folder
    ("stages/release/report.py", "ReleaseReport.read"): INPUT,
    ("stages/validate/report.py", "ValidateReport.read"): INPUT,
    ("stages/trt/runtime.py", "can_run"): INPUT,  # the engine of the build result the stage was given
    ("stages/trt/runtime.py", "EngineRunner.__init__"): INPUT,
    ("trtflow/procfs.py", "status_bytes"): "the kernel's /proc/self/status or /proc/meminfo (memory, #69)",
    ("trtflow/procfs.py", "_cgroup_room"): "the kernel's cgroup files under /sys/fs/cgroup (memory, #69)",
}


def _is_write(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wax")


def _on_proc(call: ast.Call) -> bool:
    """A read of the kernel's /proc (a literal path): no file anyone put there."""
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("/proc/")
               for n in ast.walk(call))


def _plain_read(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr in ("read_text", "read_bytes"):
        found = f.attr
    elif (isinstance(f, ast.Name) and f.id == "open") or (isinstance(f, ast.Attribute) and f.attr == "open"
                                                          and isinstance(f.value, ast.Name) and f.value.id == "io"):
        found = "open" if not _is_write(call) else None
    else:
        return None
    return None if found is None or _on_proc(call) else found


def plain_reads(source: str) -> list[tuple[str, int, str]]:
    """(function's qualified name, line, what) of every plain read in `source`."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name])
                continue
            if isinstance(child, ast.Call) and (what := _plain_read(child)):
                found.append((".".join(scope) or "<module>", child.lineno, what))
            visit(child, scope)

    visit(ast.parse(source), [])
    return found


def test_the_search_finds_plain_reads_and_only_those():
    source = '''
import io, os
class Cache:
    def take(self, entry):
        digest = (entry / "sha256").read_text()
        with open(entry / "build.json") as f, io.open(entry / "x", "rb") as g:
            return digest, f.read(), g.read(), (entry / "engine.plan").read_bytes()
    def keep(self, entry):
        with open(entry / "sha256", "w") as f, open(entry / "log", mode="ab") as g:
            return os.open(entry, os.O_RDONLY), open("/proc/self/stat").read(), f, g
'''
    assert plain_reads(source) == [("Cache.take", 5, "read_text"), ("Cache.take", 6, "open"),
                                   ("Cache.take", 6, "open"), ("Cache.take", 7, "read_bytes")]


def test_every_plain_read_is_one_of_the_allowed():
    """The engine cache, the engines' records and the timing cache were read with read_text()/read_bytes()."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for scope, line, what in plain_reads(path.read_text()):
                if (rel, scope) not in ALLOWED:
                    found.append(f"{rel}:{line} {scope}: {what}()")
    assert not found, ("plain reads outside the allowed list: read the store's files through trtflow/files.py, or "
                       "allow the read in tests/test_store_reads.py with why it is no read of the store's files:\n"
                       + "\n".join(found))
