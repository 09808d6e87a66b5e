"""A store at an S3 URL shared by workers on several machines, against a real S3-compatible server: moto's standalone
server, started here on loopback (it speaks the S3 HTTP API, conditional writes included), not a mock of the
client. Each worker has its own local cache directory, as a separate machine would."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.assets import PPOCR
from trtflow.flows.manifest import Manifest
from trtflow.flows.store import VerifyStatus

pytest.importorskip("s3fs")

PIPE = """version: 1
name: shared
model: models/cls.onnx
artifacts: {url}
stages:
  prepare: {{kind: prepare, simplify: true}}
  build:
    kind: build
    profiles:
      small: {{x: {{min: [1, 3, 48, 48], opt: [1, 3, 48, 192], max: [2, 3, 48, 320]}}}}
"""


@contextlib.contextmanager
def _moto_server(tmp: Path, **env: str) -> Iterator[dict[str, str]]:
    """moto's S3 server on a free loopback port; yields the AWS_* variables that reach it. `env` configures the
    server (INITIAL_NO_AUTH_ACTION_COUNT=0: every request is authenticated, so unknown keys are denied)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp / "moto.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **env})
    client = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
              "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"moto's S3 server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield client
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    with _moto_server(tmp_path_factory.mktemp("moto")) as env:
        yield env


@pytest.fixture
def bucket(s3_server, monkeypatch, request):
    import s3fs
    for k, v in s3_server.items():
        monkeypatch.setenv(k, v)
    import hashlib
    tag = hashlib.sha256(request.node.name.encode()).hexdigest()[:6]  # parametrized tests share a prefix
    name = "b" + request.node.name.lower().replace("_", "-")[:40].rstrip("-") + "-" + tag
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(name)
    return name, fs


def _store(url: str, cache: Path):
    from trtflow.flows.remote_store import RemoteStore
    store = RemoteStore(url, cache)
    store.ensure_writable()
    return store


def _staged(store, stage: str, key: str, content: bytes) -> Path:
    staging = store.staging(stage, key)
    (staging / "model.onnx").write_bytes(content)
    return staging


def _repo(tmp_path: Path, pipeline: str, name: str = "repo") -> Path:
    """A model repo: the PP-OCR classifier as models/cls.onnx and `pipeline` as pipeline.yaml."""
    repo = tmp_path / name
    (repo / "models").mkdir(parents=True)
    shutil.copy(PPOCR, repo / "models" / "cls.onnx")
    (repo / "pipeline.yaml").write_text(pipeline)
    return repo


def _manifest(key: str, content: bytes) -> Manifest:
    import hashlib
    return Manifest.model_validate({"key": key, "status": "ok", "stage": "s", "outputs": {"model": {
        "path": "model.onnx", "type": "onnx", "digest": hashlib.sha256(content).hexdigest()}}})


@pytest.mark.slow
def test_a_writer_that_loses_the_race_adopts_the_winners_result(bucket, tmp_path):
    """Two machines publish one key: the second checks before the first commits, uploads its own files, and loses
    the conditional create; it adopts the first one's files, and nothing of its own remains."""
    name, fs = bucket
    url = f"s3://{name}/store"
    key = "f0" * 16
    first, second = _store(url, tmp_path / "m1"), _store(url, tmp_path / "m2")
    late = _staged(second, "s", key, b"second machine's engine")
    real = second._remote_manifest
    calls = []

    def not_yet(stage, k):  # the second machine looked before the first committed
        calls.append(k)
        return (None, "") if len(calls) == 1 else real(stage, k)
    second._remote_manifest = not_yet
    _, won = first.publish("s", key, _staged(first, "s", key, b"first machine's engine"),
                           _manifest(key, b"first machine's engine"))
    directory, adopted = second.publish("s", key, late, _manifest(key, b"second machine's engine"))
    assert adopted.outputs == won.outputs
    assert (directory / "model.onnx").read_bytes() == b"first machine's engine"
    assert not late.exists()
    writers = {p.split("/")[4] for p in fs.find(f"{name}/store/s/{key}") if p.count("/") >= 5}
    assert writers == {won.blobs}, "the loser's upload was removed"
    # a third machine fetches the result and verifies it against the manifest
    third = _store(url, tmp_path / "m3")
    assert third.lookup("s", key).manifest.outputs == won.outputs
    assert (third.path("s", key) / "model.onnx").read_bytes() == b"first machine's engine"


@pytest.mark.slow
def test_verify_finds_a_corrupted_upload_and_leftovers(bucket, tmp_path):
    name, fs = bucket
    url = f"s3://{name}/store"
    key = "c" * 32
    store = _store(url, tmp_path / "m1")
    _, m = store.publish("s", key, _staged(store, "s", key, b"engine bytes"), _manifest(key, b"engine bytes"))
    fs.pipe_file(f"{name}/store/s/{key}/otherhost-4242-0badc0de/model.onnx", b"an upload whose run died")
    report = store.verify()
    assert [r.status for r in report.rows if not r.stage.startswith("(cache)")] == [VerifyStatus.OK,
                                                                                VerifyStatus.STALE_STAGING]
    fs.pipe_file(f"{name}/store/s/{key}/{m.blobs}/model.onnx", b"engine bytez")  # same size, other bytes
    bad = _store(url, tmp_path / "m2").verify().having(VerifyStatus.BAD)
    assert len(bad) == 1 and "changed content" in bad[0].problem
    other = _store(url, tmp_path / "m4")
    found = other.lookup("s", key)
    assert found.manifest is None and "failed verification" in found.rejected
    # it was quarantined: another machine's plan says why the stage must run
    later = _store(url, tmp_path / "m5")
    found = later.peek("s", key)
    assert found.manifest is None and "quarantined" in found.rejected
    store.verify(repair=True)
    assert not fs.exists(f"{name}/store/s/{key}")


@pytest.mark.slow
@pytest.mark.tensorrt
def test_two_workers_run_one_pipeline_at_once_on_one_s3_store(bucket, tmp_path):
    """Two `trtflow run` processes (two machines: each its own cache directory) run the same pipeline on one S3 store
    at the same moment: real prepare and TensorRT-RTX build stages. One consistent set of results ends up in the
    store (`trtflow verify`), each worker's local result is the store's, and a third machine reuses everything."""
    name, fs = bucket
    url = f"s3://{name}/team"
    repo = _repo(tmp_path, PIPE.format(url=url))
    env = dict(os.environ)  # both workers report to the test run's Prefect server, as a team's workers would
    cli = [sys.executable, "-m", "trtflow.flows.cli"]
    workers = []
    for i in (1, 2):
        log = open(tmp_path / f"worker{i}.log", "wb")
        workers.append((subprocess.Popen(cli + ["run", str(repo / "pipeline.yaml")], stdout=log, stderr=log,
                                         env={**env, "TRTFLOW_CACHE_DIR": str(tmp_path / f"machine{i}")},
                                         start_new_session=True), log))
    try:
        for proc, _ in workers:
            proc.wait(600)
    finally:
        for proc, log in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            log.close()
    outputs = [(tmp_path / f"worker{i}.log").read_text() for i in (1, 2)]
    assert [p.returncode for p, _ in workers] == [0, 0], outputs

    done = subprocess.run(cli + ["verify", "--store", url], capture_output=True, text=True, timeout=300,
                          env={**env, "TRTFLOW_CACHE_DIR": str(tmp_path / "auditor")})
    assert done.returncode == 0 and " 0 bad" in done.stdout, done.stdout + done.stderr
    remote = {}
    for stage in ("prepare", "build"):
        (manifest_path,) = fs.glob(f"{name}/team/{stage}/*/manifest.json")
        remote[stage] = json.loads(fs.cat_file(manifest_path))
        writers = {p.split("/")[4] for p in fs.find(manifest_path.rsplit("/", 1)[0]) if p.count("/") >= 5}
        assert writers == {remote[stage]["blobs"]}, f"{stage}: one writer's files, no leftovers"
    for i in (1, 2):
        for stage, m in remote.items():
            (local,) = (tmp_path / f"machine{i}").glob(f"*/{stage}/{m['key']}/manifest.json")
            assert json.loads(local.read_text())["outputs"] == m["outputs"], f"machine {i}'s {stage} is the store's"
    built = json.loads(fs.cat_file(f"{name}/team/build/{remote['build']['key']}/{remote['build']['blobs']}/"
                                   f"report.json"))
    assert built["cells"][0]["status"] == "ok"

    third = subprocess.run(cli + ["plan", str(repo / "pipeline.yaml"), "--check"], capture_output=True, text=True,
                           timeout=300, env={**env, "TRTFLOW_CACHE_DIR": str(tmp_path / "machine3")})
    assert third.returncode == 0, third.stdout + third.stderr

    # one flipped byte in the published engine: the next cold machine finds it on fetching, quarantines it,
    # rebuilds, republishes and passes; the store is clean afterwards and the bad files are kept aside
    build = remote["build"]
    (plan_rel,) = [rel for rel in build["files"] if rel.endswith(".plan")]
    engine = f"{name}/team/build/{build['key']}/{build['blobs']}/{plan_rel}"
    data = bytearray(fs.cat_file(engine))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(engine, bytes(data))
    fourth = subprocess.run(cli + ["run", str(repo / "pipeline.yaml")], capture_output=True, text=True, timeout=600,
                            env={**env, "TRTFLOW_CACHE_DIR": str(tmp_path / "machine4")})
    assert fourth.returncode == 0, fourth.stdout + fourth.stderr
    assert "ran build" in fourth.stdout and "failed verification" in fourth.stdout, fourth.stdout
    done = subprocess.run(cli + ["verify", "--store", url], capture_output=True, text=True, timeout=300,
                          env={**env, "TRTFLOW_CACHE_DIR": str(tmp_path / "auditor2")})
    assert done.returncode == 0 and " 0 bad" in done.stdout and "stale" not in done.stdout, done.stdout
    republished = json.loads(fs.cat_file(f"{name}/team/build/{build['key']}/manifest.json"))
    assert republished["blobs"] != build["blobs"]
    (reason,) = fs.glob(f"{name}/team/.quarantine/build/{build['key']}/{build['blobs']}/reason.json")
    assert "changed content" in json.loads(fs.cat_file(reason))["problem"]
    assert fs.exists(f"{name}/team/.quarantine/build/{build['key']}/{build['blobs']}/files/{plan_rel}")


# --- a store that cannot be used: one line, exit 2, never retried ----------------------------------------------


def _one_line_exit_2(capsys, monkeypatch, argv: list[str]) -> str:
    from trtflow.errors import StoreError
    from trtflow.flows import cli
    from trtflow.flows.cli import app
    from trtflow.flows.pipeline_flow import _retry_unless_user_error

    seen, report = [], app._fail
    monkeypatch.setattr(app, "_fail", lambda exc, verbose: seen.append(exc) or report(exc, verbose))
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    (exc,) = seen
    assert isinstance(exc, StoreError)
    state = type("State", (), {"result": lambda self, raise_on_failure=False: exc})()
    assert _retry_unless_user_error(None, None, state) is False, "Prefect's retries never repeat a store error"
    return lines[0]


def test_an_unknown_protocol_is_one_line(workdir, capsys, monkeypatch):
    (workdir / "pipeline.yaml").write_text(PIPE.format(url="nosuchproto://bucket/team"))
    line = _one_line_exit_2(capsys, monkeypatch, ["run", str(workdir / "pipeline.yaml")])
    assert line.startswith("error: cannot open the artifact store nosuchproto://bucket/team: Protocol not known")
    assert "an fsspec URL" in line
    line = _one_line_exit_2(capsys, monkeypatch, ["verify", "--store", "nosuchproto://b/t"])
    assert line.startswith("error: cannot open the artifact store nosuchproto://b/t: Protocol not known")
    assert not (workdir / ".trtflow").exists()


def test_an_unreachable_endpoint_is_one_line(workdir, capsys, monkeypatch):
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_MAX_ATTEMPTS": "1",
                 "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "TRTFLOW_CACHE_DIR": str(workdir / "cache")}.items():
        monkeypatch.setenv(k, v)
    (workdir / "pipeline.yaml").write_text(PIPE.format(url="s3://team-bucket/models"))
    line = _one_line_exit_2(capsys, monkeypatch, ["run", str(workdir / "pipeline.yaml")])
    assert line.startswith("error: artifact store s3://team-bucket/models: opening failed: EndpointConnectionError")
    assert f"127.0.0.1:{port}" in line and "check the URL, the credentials" in line


def test_a_missing_bucket_is_one_line(s3_server, workdir, capsys, monkeypatch):
    for k, v in {**s3_server, "TRTFLOW_CACHE_DIR": str(workdir / "cache")}.items():
        monkeypatch.setenv(k, v)
    (workdir / "pipeline.yaml").write_text(PIPE.format(url="s3://no-such-bucket/models"))
    line = _one_line_exit_2(capsys, monkeypatch, ["run", str(workdir / "pipeline.yaml")])
    assert line.startswith("error: artifact store s3://no-such-bucket/models: opening failed: FileNotFoundError")
    line = _one_line_exit_2(capsys, monkeypatch, ["verify", "--store", "s3://no-such-bucket/models"])
    assert "s3://no-such-bucket/models" in line and "bucket does not exist" in line


@pytest.mark.slow
def test_permission_denied_is_one_line(workdir, tmp_path, capsys, monkeypatch):
    """A server that authenticates every request, and keys it does not know: reads and writes are denied."""
    with _moto_server(tmp_path, INITIAL_NO_AUTH_ACTION_COUNT="0") as env:
        for k, v in {**env, "TRTFLOW_CACHE_DIR": str(workdir / "cache")}.items():
            monkeypatch.setenv(k, v)
        (workdir / "pipeline.yaml").write_text(PIPE.format(url="s3://team-bucket/models"))
        line = _one_line_exit_2(capsys, monkeypatch, ["run", str(workdir / "pipeline.yaml")])
        assert line.startswith("error: artifact store s3://team-bucket/models: reading prepare/")
        assert "PermissionError" in line and "check the URL, the credentials" in line
        line = _one_line_exit_2(capsys, monkeypatch, ["verify", "--store", "s3://team-bucket/models"])
        assert "s3://team-bucket/models" in line and "PermissionError" in line


# --- nothing outside what trtflow owns is deleted or written (issue #27, data loss and security) ------------------

@pytest.mark.slow
def test_verify_repair_on_s3_removes_only_trtflow_results(bucket, tmp_path, capsys, monkeypatch):
    from trtflow.flows import cli
    name, fs = bucket
    foreign = {f"{name}/data/datasets/imagenet/val.tar": b"tar", f"{name}/data/notes/README.md": b"hi",
               f"{name}/data/s/0123456789abcdef0123456789abcdef/not-a-writer/x.bin": b"someone's"}
    for path, data in foreign.items():
        fs.pipe_file(path, data)
    monkeypatch.setenv("TRTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    code = cli.main(["verify", "--store", f"s3://{name}/data", "--repair"])  # a prefix that is not a store
    err = capsys.readouterr().err
    assert code == 2 and f"s3://{name}/data is not a trtflow artifact store" in err, err
    assert all(fs.cat_file(p) == d for p, d in foreign.items())

    store = _store(f"s3://{name}/data", tmp_path / "m1")  # now a store (its first run marks it) with foreign data
    key = "c" * 32
    _, m = store.publish("s", key, _staged(store, "s", key, b"engine bytes"), _manifest(key, b"engine bytes"))
    fs.pipe_file(f"{name}/data/s/{key}/{m.blobs}/model.onnx", b"engine bytez")  # corrupt: to be removed
    assert cli.main(["verify", "--store", f"s3://{name}/data", "--repair"]) == 0
    out = capsys.readouterr().out
    assert "1 removed" in out and "left alone" in out, out
    assert all(fs.cat_file(p) == d for p, d in foreign.items()), "foreign objects are never removed"
    assert not fs.exists(f"{name}/data/s/{key}/manifest.json")


@pytest.mark.slow
@pytest.mark.parametrize("bad_path", ["/tmp/PWNED-abs", "../../PWNED-rel"], ids=["absolute", "relative"])
def test_a_poisoned_remote_manifest_writes_nothing_outside_the_cache(bucket, tmp_path, bad_path):
    name, fs = bucket
    url = f"s3://{name}/store"
    key = "d" * 32
    store = _store(url, tmp_path / "m1")
    _, m = store.publish("s", key, _staged(store, "s", key, b"engine bytes"), _manifest(key, b"engine bytes"))
    poisoned = {**m.to_json(), "files": {bad_path: m.to_json()["files"]["model.onnx"]}}
    fs.pipe_file(f"{name}/store/s/{key}/{m.blobs}/{bad_path}", b"engine bytes")
    fs.pipe_file(f"{name}/store/s/{key}/manifest.json", json.dumps(poisoned).encode())
    other = _store(url, tmp_path / "deep" / "m2")
    found = other.lookup("s", key)
    assert found.manifest is None and "is not a trtflow manifest" in found.rejected
    written = {p for p in tmp_path.rglob("*PWNED*")} | {p for p in Path("/tmp").glob("PWNED*")}
    assert written == set()
    for blobs in ("../other-prefix", "/abs"):  # the writer directory is a name, not a path
        fs.pipe_file(f"{name}/store/s/{key}/manifest.json", json.dumps({**m.to_json(), "blobs": blobs}).encode())
        third = _store(url, tmp_path / f"m3{len(blobs)}")
        found = third.lookup("s", key)
        assert found.manifest is None and "is not a trtflow manifest" in found.rejected


GATED = """version: 1
name: gated
model: models/cls.onnx
artifacts: {url}
stages:
  bench:
    kind: benchmark
    tool: builtin
    inputs: {{models: source}}
    duration: 0
    warmup: 0
    min_iterations: 3
    data: {{random: true, samples: 1, shapes: {{x: [1, 3, 48, 192]}}}}
    gate: {{baseline: previous, throughput_regression: 99%}}
"""


def _run_on(machine: str, repo: Path, tmp_path: Path, report: str, *extra: str) -> dict:
    """`trtflow run` of the repo's pipeline on `machine` (its own cache of the shared store, as another computer
    has); the one report.json of its cache matching `report`."""
    done = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "run", str(repo / "pipeline.yaml"), *extra],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRTFLOW_CACHE_DIR": str(tmp_path / machine)})
    assert done.returncode == 0, done.stdout + done.stderr
    (found,) = (tmp_path / machine).glob(report)
    return json.loads(found.read_text())


@pytest.mark.slow
def test_a_benchmark_baseline_accepted_on_one_machine_gates_another(bucket, tmp_path):
    """`shared/` (benchmark baselines, timing caches) lives in the remote store too: the baseline a run accepts on
    one machine is the one the next machine's gate compares with (it said "no baseline" on every cold machine)."""
    name, fs = bucket
    url = f"s3://{name}/team"
    repo = _repo(tmp_path, GATED.format(url=url))

    def run(machine: str, *extra: str) -> dict:
        return _run_on(machine, repo, tmp_path, "*/bench/*/report.json", *extra)

    first = run("machine1")
    assert any("no baseline" in s for s in first["gate"]["skipped"]), first["gate"]
    assert fs.glob(f"{name}/team/shared/benchmark/*.json"), "the accepted baseline was sent to the store"
    second = run("machine2", "--force", "bench")
    assert second["gate"]["skipped"] == [] and second["gate"]["violations"] == [], second["gate"]


RELEASED = """version: 1
name: released
model: models/cls.onnx
artifacts: {url}
stages:
  prepare: {{kind: prepare, preflight: "off", input_shapes: {{x: [1, 3, 48, 192]}}}}
  build:
    kind: build
    profiles: {{lines: {{x: {{min: [1, 3, 48, 48], opt: [2, 3, 48, 192], max: [4, 3, 48, 320]}}}}}}
  release: {{kind: release, select: {{require: built, prefer: size}}}}
"""


# `trtflow run` SIGKILLed by itself right after the runner created a stage's claimed records (a release's version) in
# the store, before the result is published: the test's only way in is the runner's own `claim_all`
KILLED_AFTER_CLAIM = """
import os, signal, sys
from trtflow.flows import cli, runner

claim_all = runner.claim_all

def claim_then_die(store, claims):
    lost = claim_all(store, claims)
    if claims and lost is None:
        os.kill(os.getpid(), signal.SIGKILL)
    return lost

runner.claim_all = claim_then_die
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_version_claimed_by_a_killed_run_is_announced_once_when_published(bucket, tmp_path, prefect_api):
    """The versions released so far live in the shared store: a machine that releases another engine of the same
    model after another machine did gets the next version, not 1 again. Issue #49 item 7: `trtflow run`
    SIGKILLed between claiming version 2 (a larger batch: a new contract) and publishing its release. The next run,
    on another machine, ships version 2 as new: trtflow.release.created is sent once for it, carrying the contract's
    changes since version 1 (it was shipped as not new, compared with itself: never announced, no warning). A forced
    release of it afterwards announces nothing."""
    import datetime

    import httpx

    name, fs = bucket
    started = datetime.datetime.now(datetime.timezone.utc).isoformat()
    repo = _repo(tmp_path, RELEASED.format(url=f"s3://{name}/team"), name=f"killed-{name[-6:]}")
    ledger = f"{name}/team/shared/releases/released/native"
    assert _run_on("machine1", repo, tmp_path, "*/release/*/report.json")["targets"][0]["version"] == 1
    assert json.loads(fs.cat_file(f"{ledger}/1.json"))["version"] == 1, "the version's record was created in the store"
    larger = ["--set", "stages.build.profiles.lines.x.max=[8, 3, 48, 320]",
              "--set", "stages.release.select.contract=allow_change"]
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_CLAIM, "run", str(repo / "pipeline.yaml"), *larger],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TRTFLOW_CACHE_DIR": str(tmp_path / "machine1")})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert json.loads(fs.cat_file(f"{ledger}/2.json"))["version"] == 2, "version 2 was claimed"
    assert len(fs.glob(f"{name}/team/release/*/manifest.json")) == 1, "and its release never published"

    done = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "run", str(repo / "pipeline.yaml"), *larger],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRTFLOW_CACHE_DIR": str(tmp_path / "machine2")})
    assert done.returncode == 0 and "ran release" in done.stdout, done.stdout + done.stderr
    (report,) = (tmp_path / "machine2").glob("*/release/*/report.json")
    shipped = json.loads(report.read_text())["targets"][0]
    assert (shipped["version"], shipped["new_version"], shipped["max_batch_size"]) == (2, True, 8)
    assert "max_batch_size 4 -> 8" in shipped["contract_changes"], shipped["contract_changes"]
    assert "the serving contract changed since version 1: " in done.stdout, done.stdout
    assert shipped["previous_version"] == 1
    assert fs.exists(f"{ledger}.published/2.json"), "its publication is marked in the store"

    forced = _run_on("machine3", repo, tmp_path, "*/release/*/report.json", *larger, "--force", "release")
    assert (forced["targets"][0]["version"], forced["targets"][0]["new_version"]) == (2, False)

    resource = f"trtflow.release.{repo.name}.release.native"

    def sent() -> list[dict]:
        answer = httpx.post(f"{prefect_api}/events/filter", timeout=10, json={
            "filter": {"occurred": {"since": started}, "event": {"name": ["trtflow.release.created"]},
                       "resource": {"id": [resource]}}, "limit": 50})
        answer.raise_for_status()
        return sorted(answer.json()["events"], key=lambda e: e["payload"]["version"])

    deadline, events = time.monotonic() + 30, []
    while time.monotonic() < deadline and len(events) < 2:
        time.sleep(0.5)
        events = sent()
    time.sleep(2)  # anything sent more than once has arrived by now
    events = sent()
    assert [e["payload"]["version"] for e in events] == [1, 2], events
    assert events[1]["payload"]["contract_changes"] == shipped["contract_changes"]
    assert events[1]["payload"]["previous_version"] == 1


@pytest.mark.slow
def test_credentials_from_a_prefect_secret_block_never_printed(bucket, tmp_path, monkeypatch, prefect_api):
    """The store's credentials from a Prefect Secret block (TRTFLOW_STORE_CREDENTIALS=secret/<name>), with no AWS_*
    variable set: the store works; a wrong endpoint in the block fails on one line that does not carry the
    secret; a block that does not exist is one line naming it."""
    from prefect.blocks.system import Secret

    from trtflow.errors import StoreError

    name, fs = bucket
    client = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    block = f"s3-{name}"[:60]
    Secret(value={"aws_access_key_id": client["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": "testing",
                  "endpoint_url": client["AWS_ENDPOINT_URL"], "region_name": "us-east-1"}).save(block, overwrite=True)
    monkeypatch.setenv("TRTFLOW_STORE_CREDENTIALS", f"secret/{block}")
    url = f"s3://{name}/team"
    key = "d" * 32
    store = _store(url, tmp_path / "m1")
    store.publish("s", key, _staged(store, "s", key, b"engine"), _manifest(key, b"engine"))
    assert _store(url, tmp_path / "m2").lookup("s", key).manifest is not None

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    Secret(value={"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": "s3cr3t-do-not-print",
                  "endpoint_url": f"http://127.0.0.1:{closed}"}).save(block, overwrite=True)
    # nothing listens there: one attempt, not botocore's retries with backoff (~6 s); a retry setting, no credential
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(StoreError) as info:
        _store(url, tmp_path / "m3")
    assert "s3cr3t-do-not-print" not in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv("TRTFLOW_STORE_CREDENTIALS", "secret/no-such-block")
    with pytest.raises(StoreError, match="cannot load the Prefect block secret/no-such-block"):
        _store(url, tmp_path / "m4")


@pytest.mark.slow
@pytest.mark.parametrize("key", ["releases/" + "../" * 20 + "{outside}/PWNED", "benchmark/../../{outside}/PWNED",
                                 "releases/x/..", "timing-../../PWNED"],
                         ids=["releases-absolute", "benchmark-relative", "dotdot-end", "timing"])
def test_a_poisoned_shared_key_writes_nothing_outside_the_cache(bucket, tmp_path, key):
    """An object listed under the store's shared/ whose key climbs out of it: it was written to that path (an
    existing file overwritten) by the next run of any pipeline with a build, benchmark or release stage. It is
    refused and named; the rest of shared/ is still fetched."""
    name, fs = bucket
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "PWNED").write_text("mine")
    url = f"s3://{name}/store"
    fs.pipe_file(f"{name}/store/shared/{key.format(outside=str(outside).lstrip('/'))}", b"attacker")
    fs.pipe_file(f"{name}/store/shared/benchmark/ok.json", b"{}")
    store = _store(url, tmp_path / "cache")
    store.pull_shared()
    assert (outside / "PWNED").read_text() == "mine" and sorted(p.name for p in outside.iterdir()) == ["PWNED"]
    assert not [p for p in tmp_path.rglob("PWNED") if p.parent != outside]
    assert (tmp_path / "cache" / "shared" / "benchmark" / "ok.json").read_bytes() == b"{}"
    if key.startswith(("releases/", "benchmark/")) and "{outside}" in key:
        assert any("leaves the store and was not fetched" in n for n in store.notes), store.notes


def test_an_oversized_shared_object_is_not_fetched(bucket, tmp_path):
    """A release record larger than a record can be (it was fetched whole to every machine)."""
    name, fs = bucket
    fs.pipe_file(f"{name}/store/shared/releases/m/native/1.json", b"x" * (2**20 + 1))
    store = _store(f"s3://{name}/store", tmp_path / "cache")
    store.pull_shared()
    assert not (tmp_path / "cache" / "shared" / "releases" / "m" / "native" / "1.json").exists()
    assert any("more than the 1048576 a file of its kind may have" in n for n in store.notes), store.notes


def _release_rounds(url: str, cache: str, digest: str, rounds: int, barrier, out) -> None:
    """One machine releasing model `m` for target native, `rounds` times, each time a new engine: the stage's
    proposal (versions counted from the records pulled from the store) and the runner's claim, as `trtflow run`
    does them. The barrier holds both machines between counting and claiming in the first try of each round, so
    they propose the same version every round."""
    from trtflow.flows.remote_store import RemoteStore
    from trtflow.flows.store import claim_all
    from trtflow.stages.release.triton import versions
    store = RemoteStore(url, Path(cache))
    store.ensure_writable()
    got = []
    for r in range(rounds):
        engine = hashlib.sha256(f"{digest}-{r}".encode()).hexdigest()
        for attempt in range(10):
            store.pull_shared()
            version, _ = versions.read(store.root / "shared", "m", "native").version_for(engine)
            if attempt == 0:
                barrier.wait(timeout=60)
            if claim_all(store, [versions.claim("m", "native", version, engine, digest)]) is None:
                got.append((version, engine, attempt))
                break
        else:
            raise AssertionError("no version after 10 tries")
    out.put(got)


@pytest.mark.slow
def test_two_machines_releasing_at_once_never_share_a_version(bucket, tmp_path):
    """Two processes, each its own cache of one S3 store (moto), release a new engine of one model and target at
    once, 20 rounds: the conditional create gives each version to one engine; the loser counts again and takes
    the next. Every round both first propose the same version, so every round is a real race."""
    import multiprocessing

    name, fs = bucket
    url = f"s3://{name}/store"
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_release_rounds, args=(url, str(tmp_path / m), m, 20, barrier, out))
             for m in ("machine1", "machine2")]
    for p in procs:
        p.start()
    results = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    versions = [v for got in results for v, _, _ in got]
    assert sorted(versions) == list(range(1, 41)), "each version given once, none skipped"
    assert sum(attempt > 0 for got in results for _, _, attempt in got) >= 20, "every round one machine lost"
    records = {int(p.rsplit("/", 1)[1].split(".")[0]): json.loads(fs.cat_file(p))["owner"]
               for p in fs.glob(f"{name}/store/shared/releases/m/native/*.json")}
    engines = {v: e for got in results for v, e, _ in got}
    assert records == engines


def test_verify_names_a_result_that_read_another_digest_than_the_one_published():
    """Two runs published an upstream key differently: a downstream result whose recorded input digest is not one of
    the published upstream's outputs is a bad row naming the input and where it was read from."""
    from trtflow.flows.remote_store import RemoteStore

    up, down = "a" * 32, "b" * 32
    upstream = _manifest(up, b"the engine published")
    read = {"path": f"/cache/store/s/{up}/model.onnx", "type": "onnx", "digest": hashlib.sha256(b"another").hexdigest()}
    downstream = Manifest.model_validate({**_manifest(down, b"report").to_json(), "stage": "t",
                                         "inputs": {"model": read}})
    (row,) = RemoteStore._consistency({("s", up): upstream, ("t", down): downstream})
    assert (row.stage, row.key, row.status) == ("t", down, VerifyStatus.BAD)
    assert f"input 'model' was read from s/{up[:12]}" in row.problem
    same = {**read, "digest": upstream.outputs["model"].digest}
    downstream = Manifest.model_validate({**downstream.to_json(), "inputs": {"model": [same]}})
    assert RemoteStore._consistency({("s", up): upstream, ("t", down): downstream}) == []
