"""Issue #52's three traces, counted the same way at any commit: how many of trtflow's own source files a newcomer
follows for each.

A file counts when at least one *function* body in it runs (a profile event in a code object with CO_OPTIMIZED set:
not a module body, not a class body) outside an import (no importlib `_find_and_load` frame under it in that
thread): what runs because a module is imported (its top level, the decorators and calls it makes) does not count.
trtflow's files are the package's four folders of the tree measured: flows/, stages/, pipelines/, trtflow/.
Recorded in every Python process of the run, by a sitecustomize.py put on PYTHONPATH (`sys.setprofile` and
`threading.setprofile` at interpreter start): `trtflow run`, multiprocessing's fork server, the stage processes it
forks, and the helpers a stage starts (`python -m ...`). Each process writes what it saw at exit, at `os._exit`
(patched), after each fork in the parent (the fork server is SIGKILLed with its parent), and at the stop line.

1. `prepare`: `trtflow run` of a one-stage pipeline (`kind: prepare`, the example's block) on the PP-OCR classifier,
   a fresh store: every process, from the interpreter's start to its exit. Split into the orchestration path (a
   function that ran outside stages/prepare/stage.py:run, in a process other than the helpers the stage process
   started) and the kind's own work (the rest: files whose functions ran only inside prepare's run() or in its
   helpers).
2. `release`: the PP-OCR example pipeline (its 472b6ac form: no validate `labels:`, which 472b6ac lacks), every
   stage but release run first, unrecorded; then `trtflow run` again, recorded, which runs release alone. Counted:
   the release stage process, from the call of stages/release/stage.py:run until `_repository` (which writes the
   Triton model repository) returns (also given: to the end of run(), the model card included).
3. `crash`: a one-stage pipeline whose user stage (crashy.py beside it, not counted: it is the user's code) prints a
   line, sleeps 1 s (the parent's log tail reads the line), writes the time and sends itself SIGSEGV. Counted: the
   functions of the processes still alive (the CLI; the fork server runs none) with a profile event after that
   time, until the CLI writes its `error:` line to stderr (recording stops there).

    python bench/traces.py [TREE[=PYTHON] ...]      (default: this repository with this interpreter)

e.g. `git worktree add /tmp/old 472b6ac`, a venv with it installed (`pip install -e "/tmp/old[rtx,torch,test]"`), then
`python bench/traces.py /tmp/old=/tmp/venv-old/bin/python .`: a table, each trace's files, and what changed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "examples/ppocr-cls/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"

SITECUSTOMIZE = r'''
import os, sys
if os.environ.get("TRACE_DIR"):
    import _thread, atexit, json, re, threading, time
    _DIR, _ROOT = os.environ["TRACE_DIR"], os.path.realpath(os.environ["TRACE_ROOT"]) + os.sep
    _SCOPE, _UNTIL = os.environ.get("TRACE_SCOPE", ""), os.environ.get("TRACE_UNTIL", "")
    _STOP = re.compile(r"(^|\n)(\x1b\[[0-9;]*m)*error:") if os.environ.get("TRACE_STOP") else None
    _files, _codes, _imports, _scoped, _marks, _state = {}, {}, {}, {}, {}, {"on": True, "forked": False}

    def _classify(name):
        if name == "<frozen importlib._bootstrap>":
            return 2
        rel = os.path.realpath(name)[len(_ROOT):] if os.path.realpath(name).startswith(_ROOT) else ""
        return rel if rel.split(os.sep, 1)[0] in ("flows", "stages", "pipelines", "trtflow") else 0

    def _entry(code, rel):
        where = f"{rel}:{code.co_name}"
        role = 0 if not code.co_flags & 1 else 2 if where == _SCOPE else 3 if where == _UNTIL else 1  # 1: CO_OPTIMIZED
        return [code, rel, code.co_name, role, None, None, False]  # the code kept alive: its id stays its own

    def _hook(frame, event, arg):
        code = frame.f_code
        kind = _files.get(code.co_filename)
        if kind is None:
            kind = _files[code.co_filename] = _classify(code.co_filename)
        if not kind or not _state["on"]:
            return
        tid = _thread.get_ident()
        if kind == 2:
            if code.co_name == "_find_and_load" and event in ("call", "return"):
                _imports[tid] = max(0, _imports.get(tid, 0) + (1 if event == "call" else -1))
            return
        if _imports.get(tid):
            return
        e = _codes.get(id(code))
        if e is None:
            e = _codes[id(code)] = _entry(code, kind)
        if _SCOPE:
            depth = _scoped.get(tid, 0) + (e[3] == 2 and event == "call")
            if depth <= 0:
                e[6] = True  # ran outside the scope
                return
            _scoped[tid] = depth - (e[3] == 2 and event == "return")
            if e[3] == 3 and event == "return":
                _marks["until"] = time.time()
        if e[3]:
            now = time.time()
            if e[4] is None:
                e[4] = now
            e[5] = now

    def _dump():
        data = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:4], "forked": _state["forked"],
                "marks": dict(_marks), "functions": [e[1:3] + e[4:] for e in list(_codes.values()) if e[3]]}
        path = os.path.join(_DIR, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)

    def _reset():
        _codes.clear()
        _marks.clear()
        _scoped.clear()
        _state["forked"] = True

    _real_exit = os._exit

    def _exit(code):
        try:
            _dump()
        finally:
            _real_exit(code)

    class _Stderr:
        def __init__(self, f):
            self._f = f
        def write(self, text):
            if _state["on"] and _STOP.search(text):
                _marks["stop"] = time.time()
                _state["on"] = False
                _dump()
            return self._f.write(text)
        def __getattr__(self, name):
            return getattr(self._f, name)

    os._exit = _exit
    atexit.register(_dump)
    os.register_at_fork(after_in_child=_reset, after_in_parent=_dump)
    if _STOP is not None:
        sys.stderr = _Stderr(sys.stderr)
    threading.setprofile(_hook)
    sys.setprofile(_hook)
'''

CRASHY = '''
import os, signal, time
from pathlib import Path


def crash(params, inputs, out_dir):
    print("about to crash", flush=True)
    time.sleep(1)
    Path(os.environ["TRACE_CRASH"]).write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGSEGV)
'''

PREPARE = """
version: 1
name: trace-prepare
model: models/cls.onnx
stages:
  prepare: {kind: prepare, target_opset: 17, simplify: true, input_shapes: {x: [1, 3, 48, 192]}}
"""

CRASH = """
version: 1
name: trace-crash
model: models/cls.onnx
stages:
  s: {kind: "crashy:crash", outputs: {model: onnx}}
"""

# examples/ppocr-cls/pipeline.yaml as at 472b6ac (comments dropped)
RELEASE = """
version: 1
name: ppocr-cls
model: models/ch_ppocr_mobile_v2.0_cls_infer.onnx
stages:
  prepare: {kind: prepare, target_opset: 17, simplify: true, input_shapes: {x: [1, 3, 48, 192]}}
  parity:
    kind: parity
    images: data/*.png
    deploy:
      - read: bgr
      - resize: {height: 48, max_width: 192, round: ceil}
      - scale: 1/255
      - normalize: {mean: [0.5], std: [0.5]}
      - layout: chw
      - pad: {size: [48, 192], value: 0}
      - batch: true
    training: {callable: trtflow.stages.image.paddleocr:cls_resize_norm_img}
    tolerances: {max_abs: 0.001, mean_abs: 0.0001, top1: 100%}
  fp16: {kind: precision, to: fp16, data: {images: data/*.png}, holdout: 4}
  build:
    kind: build
    profiles: {lines: {x: {min: [1, 3, 48, 48], opt: [8, 3, 48, 192], max: [32, 3, 48, 640]}}}
  validate: {kind: validate, data: {images: data/*.png}, tolerances: {"*": {top1: 100%}}}
  benchmark: {kind: benchmark, duration: 1s, gate: {baseline: previous, throughput_regression: 20%}}
  release: {kind: release, select: {require: validated, prefer: throughput, max_accuracy_drop: 0%}}
"""
BEFORE_RELEASE = ["prepare", "parity", "fp16", "build", "validate", "benchmark"]


def prefect_server(home: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TRACE_", "PYTHONPATH"))}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    with open(home / "server.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                 str(port), "--no-ui"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    for _ in range(720):
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.25)
    raise SystemExit(f"the Prefect server did not answer (log: {home / 'server.log'})")


class Tree:
    """One checkout and the interpreter it is installed in; `run` is `trtflow ARGS` in `work`, recorded or not."""

    def __init__(self, spec: str, base: Path, api: str):
        path, _, python = spec.partition("=")
        self.root, self.python = Path(path).resolve(), Path(python or sys.executable)
        self.base, self.api = base, api
        where = subprocess.run([str(self.python), "-c", "import trtflow.flows.isolate as m; print(m.__file__)"],
                               cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True).stdout.strip()
        if not Path(where).is_relative_to(self.root):
            raise SystemExit(f"{self.python} imports trtflow from {where}, not from {self.root}")
        self.site = base / "site"
        self.site.mkdir(parents=True, exist_ok=True)
        (self.site / "sitecustomize.py").write_text(SITECUSTOMIZE)

    def run(self, work: Path, args: list[str], record: Path | None = None, **extra: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PREFECT_", "TRTFLOW_", "TRACE_", "PYTHONPATH"))}
        env.update(PREFECT_API_URL=self.api, PREFECT_HOME=str(self.base / "prefect-home"),
                   PREFECT_SERVER_ANALYTICS_ENABLED="false", TRTFLOW_STATE_DIR=str(work / "state"),
                   TRTFLOW_CACHE_DIR=str(work / "cache"))
        if record is not None:
            record.mkdir(parents=True, exist_ok=True)
            env.update(PYTHONPATH=str(self.site), TRACE_DIR=str(record), TRACE_ROOT=str(self.root), **extra)
        return subprocess.run([str(self.python.parent / "trtflow")] + args, cwd=work, env=env, capture_output=True,
                              text=True, check=False)

    def workdir(self, name: str, yaml: str) -> Path:
        work = self.base / name
        (work / "models").mkdir(parents=True)
        shutil.copy(self.root / MODEL, work / "models" / "cls.onnx")
        (work / "pipeline.yaml").write_text(yaml.lstrip())
        return work


def dumps(record: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(record.glob("*.json"))]


def files(functions, since: float = float("-inf"), until: float = float("inf")) -> set[str]:
    """The files of `functions` ([file, name, first, last, outside]) with an event in [since, until] (in the scope,
    where there is one)."""
    return {f for f, _, first, last, _ in functions if first is not None and last >= since and first <= until}


def checked(proc: subprocess.CompletedProcess, what: str, ok: bool = True) -> None:
    if (proc.returncode == 0) != ok:
        raise SystemExit(f"{what}: exit code {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def trace_prepare(tree: Tree) -> dict:
    work = tree.workdir("prepare", PREPARE)
    proc = tree.run(work, ["run", "pipeline.yaml"], work / "record", TRACE_SCOPE="stages/prepare/stage.py:run")
    checked(proc, "prepare")
    got = dumps(work / "record")
    every = {f for d in got for f, *_ in d["functions"]}
    stage = {d["pid"] for d in got if files(d["functions"])}  # the process that entered prepare's run()
    outside = {f for d in got if d["ppid"] not in stage for f, *_, out in d["functions"] if out}
    return {"prepare": every, "prepare (orchestration)": outside, "prepare (the kind's own work)": every - outside,
            "processes": len(got)}


def trace_release(tree: Tree) -> dict:
    work = tree.base / "release"
    shutil.copytree(tree.root / "examples" / "ppocr-cls", work, ignore=shutil.ignore_patterns("pipeline.yaml"))
    (work / "pipeline.yaml").write_text(RELEASE.lstrip())
    checked(tree.run(work, ["run", "pipeline.yaml"] + [a for s in BEFORE_RELEASE for a in ("--stage", s)]),
            "the example up to release")
    proc = tree.run(work, ["run", "pipeline.yaml"], work / "record", TRACE_SCOPE="stages/release/stage.py:run",
                    TRACE_UNTIL="stages/release/stage.py:_repository")
    checked(proc, "release")
    [stage] = [d for d in dumps(work / "record") if files(d["functions"])]  # the process that entered run()
    return {"release": files(stage["functions"], until=stage["marks"]["until"]),
            "release (whole run())": files(stage["functions"])}


def trace_crash(tree: Tree) -> dict:
    work = tree.workdir("crash", CRASH)
    (work / "crashy.py").write_text(CRASHY)
    proc = tree.run(work, ["run", "pipeline.yaml"], work / "record", TRACE_CRASH=str(work / "crashed-at"),
                    TRACE_STOP="1")
    checked(proc, "crash", ok=False)
    crashed = float((work / "crashed-at").read_text())
    got = dumps(work / "record")
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    return {"crash": set().union(*(files(d["functions"], since=crashed) for d in got)),
            "crash line": line[0] if line else proc.stderr[-500:]}


def measure(tree: Tree) -> dict:
    results = {}
    for trace in (trace_prepare, trace_release, trace_crash):
        started = time.monotonic()
        results.update(trace(tree))
        print(f"{tree.root}: {trace.__name__} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return results


def report(trees: list[Tree], results: list[dict]) -> None:
    traces = [k for k, v in results[0].items() if isinstance(v, set)]
    print("| trace | " + " | ".join(str(t.root) for t in trees) + " |")
    print("|---|" + "---:|" * len(trees))
    for name in traces:
        print(f"| {name} | " + " | ".join(str(len(r[name])) for r in results) + " |")
    for name in traces:
        print(f"\n### {name}\n")
        for tree, r in zip(trees, results):
            print(f"- {tree.root} ({len(r[name])}): " + ", ".join(sorted(r[name])))
        if len(trees) == 2:
            old, new = results[0][name], results[1][name]
            print(f"- dropped: {', '.join(sorted(old - new)) or '-'}")
            print(f"- added: {', '.join(sorted(new - old)) or '-'}")
    print()
    for tree, r in zip(trees, results):
        print(f"- {tree.root}: {r['processes']} processes recorded in the prepare run; the crash's line: "
              f"`{r['crash line']}`")


def main(argv: list[str]) -> int:
    specs = argv or [str(ROOT)]
    base = Path(tempfile.mkdtemp(prefix="trtflow-traces-"))
    (base / "prefect-home").mkdir()
    server, api = prefect_server(base / "prefect-home")
    try:
        trees = [Tree(spec, base / f"tree{i}", api) for i, spec in enumerate(specs)]
        results = [measure(tree) for tree in trees]
        report(trees, results)
        (base / "results.json").write_text(json.dumps(
            [{k: sorted(v) if isinstance(v, set) else v for k, v in r.items()} for r in results], indent=1))
        print(f"\n(recordings and results.json in {base})", file=sys.stderr)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
