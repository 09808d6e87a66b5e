"""Small user stages (kind: tests.stage_fns:NAME) used to exercise the runner without ONNX work.

Written as users write theirs: against the public API, `from trtflow import ...`."""
from __future__ import annotations

import os
import time
from pathlib import Path

from trtflow import StageError, StageFailed, StageResult


class _Calls:
    """The stage functions called, across processes (stages run in a child process): one line each in the
    file `TRTFLOW_TEST_CALLS` names (tests/conftest.py sets it per test)."""

    def _file(self) -> Path:
        return Path(os.environ["TRTFLOW_TEST_CALLS"])

    def append(self, name: str) -> None:
        with open(self._file(), "a") as f:
            f.write(name + "\n")

    def clear(self) -> None:
        self._file().write_text("")

    def list(self) -> list[str]:
        try:
            return self._file().read_text().split()
        except FileNotFoundError:
            return []

    def __len__(self) -> int:
        return len(self.list())

    def __eq__(self, other: object) -> bool:
        return self.list() == other

    def __repr__(self) -> str:
        return repr(self.list())


CALLS = _Calls()


def copy_model(params, inputs, out_dir: Path) -> StageResult:
    """Copy the input model, appending params['tag'] so different params give different outputs."""
    CALLS.append("copy_model")
    data = inputs["model"].path.read_bytes() + str(params.params.get("tag", "")).encode()
    (out_dir / "model.onnx").write_bytes(data)
    return StageResult(outputs={"model": out_dir / "model.onnx"}, summary=f"copied {len(data)} bytes",
                       metrics={"bytes": len(data)})


def count_bytes(params, inputs, out_dir: Path) -> StageResult:
    CALLS.append("count_bytes")
    n = inputs["model"].path.stat().st_size
    (out_dir / "report.json").write_text(f'{{"bytes": {n}}}')
    return StageResult(outputs={"report": out_dir / "report.json"}, summary=f"{n} bytes")


def fail(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "model.onnx").write_bytes(b"half")  # written, then the stage fails: must not be published
    raise StageError("planted failure")


def die(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "model.onnx").write_bytes(b"half")
    os._exit(17)  # a crash inside native code looks like this to the parent


def sleep(params, inputs, out_dir: Path) -> StageResult:
    time.sleep(float(params.params.get("seconds", 30)))
    return StageResult(outputs={})


def no_outputs(params, inputs, out_dir: Path) -> StageResult:
    return StageResult(outputs={})


def verdict_fail(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "report.json").write_text('{"verdict": "fail"}')
    raise StageFailed("checked, and it is wrong", StageResult(outputs={"report": out_dir / "report.json"},
                                                              summary="# why it failed"))


def engines(params, inputs, out_dir: Path) -> StageResult:
    """A directory output of several files, as the build stage publishes (one engine per cell)."""
    CALLS.append("engines")
    data = inputs["model"].path.read_bytes()
    for cell in ("fp32", "fp16"):
        (out_dir / "engines" / cell).mkdir(parents=True)
        (out_dir / "engines" / cell / "engine.plan").write_bytes(cell.encode() + data[:1000])
    return StageResult(outputs={"engines": out_dir / "engines"}, summary="2 engines")


def crash(params, inputs, out_dir: Path) -> StageResult:
    """A native crash: `how: segfault` dereferences NULL, `how: exit` is os._exit(3)."""
    (out_dir / "model.onnx").write_bytes(b"half")
    print("about to crash", flush=True)
    if params.params.get("how") == "segfault":
        import ctypes
        ctypes.string_at(0)
    os._exit(3)


def spawn_and_sleep(params, inputs, out_dir: Path) -> StageResult:
    """Starts a long-lived process of its own (its pid written to params['pidfile']; with params['detach'], in a
    session of its own, as `setsid` or a daemon would), then sleeps params['seconds'] (and then writes a model)."""
    import subprocess
    proc = subprocess.Popen(["sleep", "300"], start_new_session=bool(params.params.get("detach")))
    Path(params.params["pidfile"]).write_text(str(proc.pid))
    time.sleep(float(params.params.get("seconds", 300)))
    (out_dir / "model.onnx").write_bytes(b"made")
    return StageResult(outputs={"model": out_dir / "model.onnx"})


def flaky(params, inputs, out_dir: Path) -> StageResult:
    """Crashes on its first attempt (no marker yet at params['marker']), succeeds after."""
    marker = Path(params.params["marker"])
    CALLS.append("flaky")
    if not marker.exists():
        marker.write_text("crashed once")
        os._exit(9)
    (out_dir / "report.json").write_text("{}")
    return StageResult(outputs={"report": out_dir / "report.json"})


def raise_value_error(params, inputs, out_dir: Path) -> StageResult:
    raise ValueError("the user's own bug\nwith a second line")


def judge(params, inputs, out_dir: Path) -> StageResult:
    """A verdict that depends on something outside its key (the file params['fail_if'] names): a flaky check."""
    (out_dir / "report.json").write_text(inputs["model"].path.read_bytes()[:10].hex())
    if Path(params.params["fail_if"]).exists():
        raise StageFailed("judged wrong this time", StageResult(outputs={"report": out_dir / "report.json"},
                                                                summary="# failed this time"))
    return StageResult(outputs={"report": out_dir / "report.json"}, summary="# ok")


def random_model(params, inputs, out_dir: Path) -> StageResult:
    """A non-deterministic stage: every run writes other bytes."""
    (out_dir / "model.onnx").write_bytes(os.urandom(4096))
    return StageResult(outputs={"model": out_dir / "model.onnx"})


def fail_naming_its_output(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "half.onnx").write_bytes(b"half")
    raise StageError(f"cannot finish {out_dir / 'half.onnx'}")


def interval(params, inputs, out_dir: Path) -> StageResult:
    """Records when it ran (start and end, in params['log']), sleeping params['seconds'] in between; with
    params['meet'] (another interval's tag), first waits up to 120 s for that one to have started, so two stages
    run side by side overlap however late a busy machine starts the second (run one after the other, they do not)."""
    start = time.time()
    log = Path(params.params["log"])
    (log.parent / f"{log.name}.{params.params['tag']}.started").touch()
    if "meet" in params.params:
        other = log.parent / f"{log.name}.{params.params['meet']}.started"
        deadline = time.monotonic() + 120
        while not other.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(float(params.params.get("seconds", 1)))
    with open(params.params["log"], "a") as f:
        f.write(f"{params.params['tag']} {start} {time.time()}\n")
    (out_dir / "report.json").write_text("{}")
    return StageResult(outputs={"report": out_dir / "report.json"})


def write_symlink(params, inputs, out_dir: Path) -> StageResult:
    """A directory output holding an engine file and a symlink to the input model."""
    (out_dir / "engines").mkdir()
    (out_dir / "engines" / "a.plan").write_bytes(b"engine")
    (out_dir / "engines" / "b.plan").symlink_to(inputs["model"].path)
    return StageResult(outputs={"engines": out_dir / "engines"})


def sign_agreement(reference, candidate):
    """A user's metric (validate: metrics.<output>.callable): the share of elements whose sign agrees."""
    import numpy as np

    return {"sign_agree": float((np.sign(reference) == np.sign(candidate)).mean())}


def face_iou(reference, candidate):
    """A user's metric on a face segmenter's 2-channel softmax (background, face): IoU of the face regions."""
    r, g = reference[:, 1] > 0.5, candidate[:, 1] > 0.5
    union = (r | g).sum()
    return {"face_iou": float((r & g).sum() / union) if union else 1.0}


def picodet_boxes(outputs, feed):
    """A detections decoder for a head spread over two outputs, as PicoDet's: `scores` [N, C, A] (class scores per
    anchor) and `boxes` [N, A, 4] (x1, y1, x2, y2). Also checks it is given the inputs."""
    assert "image" in feed, feed
    return [(b, s.max(0), s.argmax(0)) for s, b in zip(outputs["scores"], outputs["boxes"])]


def chatty(params, inputs, out_dir: Path) -> StageResult:
    """Writes params['lines'] numbered lines to stdout and one to stderr, as a library does, then (with
    `crash: true`) dies without a word of Python."""
    import sys
    for i in range(int(params.params.get("lines", 3))):
        print(f"builder says {i}", flush=True)
    print("a warning on stderr", file=sys.stderr, flush=True)
    if params.params.get("crash"):
        os._exit(7)
    (out_dir / "report.json").write_text("{}")
    return StageResult(outputs={"report": out_dir / "report.json"})


def mean_abs_error(ref, got):
    """A user metric better lower (declared so in the pipeline)."""
    import numpy as np

    return {"abs_err": float(np.abs(ref.astype(np.float64) - got).mean())}


def plot(params, inputs, out_dir: Path) -> StageResult:
    """A stage that draws a plot with trtflow's own plotting (validate's error histograms) into plots/."""
    import numpy as np

    from trtflow.stages.compare.plots import error_histograms

    rng = np.random.default_rng(0)
    (out_dir / "plots").mkdir()
    path = error_histograms({"logits": [np.abs(rng.normal(0, 1e-3, 1000))]}, out_dir / "plots" / "errors.png", "errors")
    return StageResult(outputs={"plot": path}, summary="drew **the error histogram**")


def claiming(params, inputs, out_dir: Path) -> StageResult:
    """A result that needs a record of the store's shared/ claimed (as a release's version), for the runner's
    claim-and-retry step."""
    from trtflow.artifact import Claim

    CALLS.append("claiming")
    (out_dir / "note.txt").write_text("claimed")
    return StageResult(outputs={"note": out_dir / "note.txt"},
                       claims=[Claim(path="records/one.json", data=b"{}", owner="a" * 64)])


def fake_engine(params, inputs, out_dir: Path) -> StageResult:
    """A stand-in engine build for a fleet (tests/test_fleet.py): the model's bytes and this machine's GPUs and
    driver as the fingerprint reads them, so that, as a real engine, it differs from one GPU or driver to another;
    its start marked (`<params['marks']>/<machine>.<pipeline>.engine`) and `params['seconds']` of building."""
    from trtflow.flows.keys import fingerprint

    CALLS.append("fake_engine")
    _mark(params, "engine")
    time.sleep(float(params.params.get("seconds", 0)))
    gpus = fingerprint(("gpu",)).to_json()
    (out_dir / "model.plan").write_bytes(inputs.one("model").path.read_bytes() + repr(sorted(gpus.items())).encode())
    return StageResult(outputs={"engine": out_dir / "model.plan"})


def ship_version(params, inputs, out_dir: Path) -> StageResult:
    """A stand-in release for a fleet: the next version of `params['model']` for this machine's GPU kind, read from
    the store's ledger on S3 (`params['ledger']`: the store's shared/ URL) as the release stage reads its own (the
    latest version where it holds this engine already), and
    claimed for this engine (owner: the engine's digest) before the result is published; where another machine
    claimed that number first, the runner runs this again and it takes the next. Its start is marked as
    fake_engine's; while `<params['marks']>/<machine>.ship-slow` exists (at most 120 s) it waits, so that a test can
    kill the machine in the middle of it."""
    import hashlib
    import json

    import s3fs

    from trtflow.artifact import Claim
    from trtflow.flows.keys import fingerprint
    from trtflow.flows.machine import machine_kind

    CALLS.append("ship_version")
    _mark(params, "ship")
    slow = Path(params.params["marks"], f"{os.environ.get('TRTFLOW_MACHINE', '')}.ship-slow")
    deadline = time.monotonic() + 120
    while slow.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    kind = machine_kind(fingerprint(("gpu",)))
    engine = inputs.one("engine").path.read_bytes()
    owner = hashlib.sha256(engine).hexdigest()
    fs = s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    folder = f"{params.params['ledger']}/ledger/{params.params['model']}/{kind}"
    taken = {int(Path(p).stem): p for p in (fs.ls(folder) if fs.exists(folder) else []) if Path(p).stem.isdigit()}
    latest = max(taken, default=0)
    # as the release's ledger (versions.Ledger.version_for): the latest version, where it holds this engine; else
    # one more
    same = latest and json.loads(fs.cat(taken[latest])).get("owner") == owner
    version = latest if same else latest + 1
    record = {"owner": owner, "version": version, "machine": os.environ.get("TRTFLOW_MACHINE", "")}
    (out_dir / "release.json").write_text(json.dumps(record))
    return StageResult(outputs={"release": out_dir / "release.json"}, metrics={"version": version, "kind": kind},
                       claims=[Claim(path=f"ledger/{params.params['model']}/{kind}/{version}.json",
                                     data=json.dumps(record).encode(), owner=owner)])


def _mark(params, what: str) -> None:
    marks = params.params.get("marks")
    if marks:
        from trtflow.flows.machine import machine_name

        Path(marks, f"{machine_name()}.{params.params.get('model', '')}.{what}").touch()


def inline_plot(params, inputs, out_dir: Path) -> StageResult:
    """Two plots, the summary showing the first inline (as parity's summary shows its picture)."""
    import base64

    import numpy as np

    from trtflow.stages.compare.plots import error_histograms

    rng = np.random.default_rng(0)
    shown = error_histograms({"logits": [np.abs(rng.normal(0, 1e-3, 1000))]}, out_dir / "shown.png", "shown")
    other = error_histograms({"logits": [np.abs(rng.normal(0, 1e-2, 1000))]}, out_dir / "other.png", "other")
    url = "data:image/png;base64," + base64.b64encode(shown.read_bytes()).decode()
    return StageResult(outputs={"shown": shown, "other": other}, summary=f"the worst one: ![shown]({url})")
