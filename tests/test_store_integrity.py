"""The store never serves what it did not verify: files deleted or changed inside a published result, metadata of
the wrong shape, staging left by dead runs (issue #11)."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests import stage_fns
from tests.assets import need
from tests.conftest import NOBODY, closed_to_others, reachable_tmp
from tests.test_runner import plan_of, run_all
from trtflow.flows import cli
from trtflow.flows.manifest import Manifest
from trtflow.flows.store import HOST, VerifyStatus

PIPE = """
version: 1
name: integrity
model: models/cls.onnx
stages:
  a: {kind: "tests.stage_fns:copy_model", outputs: {model: onnx}, inputs: {model: source}}
  build: {kind: "tests.stage_fns:engines", outputs: {engines: dir}, inputs: {model: a}}
  c: {kind: "tests.stage_fns:count_bytes", outputs: {report: json}, inputs: {model: a}}
"""


def published(store: Path, stage: str) -> Path:
    (directory,) = [d for d in (store / stage).iterdir() if d.is_dir() and not d.name.startswith(".")]
    return directory


@pytest.fixture
def pipe(write_yaml, workdir):
    path = write_yaml(PIPE)
    assert set(run_all(path).values()) == {"ran"}
    return path, workdir / ".trtflow"


def test_files_deleted_inside_a_directory_output_are_not_reused(pipe):
    path, store = pipe
    for plan in (published(store, "build") / "engines").rglob("engine.plan"):
        plan.unlink()
    assert plan_of(path)["build"] == ("run", "its stored result failed verification: "
                                          "engines/fp16/engine.plan is missing")
    stage_fns.CALLS.clear()
    assert run_all(path) == {"a": "reused", "build": "ran", "c": "reused"}
    assert len(list((published(store, "build") / "engines").rglob("engine.plan"))) == 2


def test_a_same_size_corruption_is_noticed(pipe):
    path, store = pipe
    model = published(store, "a") / "model.onnx"
    data = bytearray(model.read_bytes())
    data[100] ^= 0xFF
    model.write_bytes(bytes(data))  # same size, new mtime: re-hashed on reuse
    assert run_all(path) == {"a": "ran", "build": "reused", "c": "reused"}  # same output again: downstream keeps
    assert published(store, "a").joinpath("model.onnx").read_bytes()[100] != data[100]


def restore_mtime_after(path: Path, change) -> None:
    st = path.stat()
    change(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def flip_byte(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_file_written_in_place_with_its_mtime_restored_is_never_reused(pipe, capsys):
    path, store = pipe
    restore_mtime_after(published(store, "a") / "model.onnx", flip_byte)  # size and mtime as recorded; not ctime
    action, reason = plan_of(path)["a"]
    assert action == "run" and "model.onnx changed content" in reason
    assert cli.main(["verify", "--store", str(store)]) == 1
    out = capsys.readouterr().out
    assert "model.onnx changed content" in out and "2 results verified, 1 bad" in out.replace("\n", " ")
    assert cli.main(["verify", str(path), "--repair"]) == 0
    assert "1 removed" in capsys.readouterr().out
    assert run_all(path)["a"] == "ran"
    assert cli.main(["verify", "--store", str(store)]) == 0
    assert "3 results verified, 0 bad" in capsys.readouterr().out


def test_a_source_model_changed_in_place_with_its_mtime_restored_is_an_input_change(pipe):
    path, store = pipe
    restore_mtime_after(path.parent / "models" / "cls.onnx", lambda p: flip_byte(p, at=-5))
    assert plan_of(path)["a"] == ("run", "input 'model' changed")


def test_a_file_hard_linked_elsewhere_is_hashed_once_then_trusted_again(pipe):
    """A link moves ctime and not the content (the engine cache links engines): hashed, found equal, remembered."""
    path, store = pipe
    model = published(store, "a") / "model.onnx"
    os.link(model, store / "elsewhere.onnx")
    assert set(run_all(path).values()) == {"reused"}
    cache = json.loads((store / "digests.json").read_text())
    assert cache[str(model.resolve())][3] == model.stat().st_ctime_ns


@contextlib.contextmanager
def within(seconds: int):
    """Fail instead of hanging (a FIFO opened for reading waits for a writer for ever)."""
    def expired(*_):
        raise AssertionError(f"still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


@pytest.mark.parametrize("file, make, problem", [
    ("model.onnx", _fifo, "model.onnx is a FIFO, not the file it was"),
    ("model.onnx", _dev_zero, "model.onnx is a symlink, not the file it was"),
    ("manifest.json", _fifo, "manifest.json is a FIFO, not a regular file; ignored"),
    ("manifest.json", _dev_zero, "manifest.json is a symlink; ignored"),
    ("../last.json", _fifo, None), ("../last.json", _dev_zero, None), ("../../digests.json", _fifo, None),
])
def test_store_files_that_are_not_files_are_never_read(pipe, capsys, file, make, problem):
    """A FIFO or /dev/zero where a result's file, manifest, last.json or the digest cache belongs: `plan`, `verify`
    and `run` answer at once (they hung, or ran out of memory): a result is recomputed, a record ignored."""
    path, store = pipe
    make(published(store, "a") / file)
    with within(5):
        action, reason = plan_of(path)["a"]
        assert (action, problem is None or reason.endswith(problem)) == ("reuse" if problem is None else "run", True)
        assert cli.main(["verify", "--store", str(store)]) == (0 if problem is None else 1)
        assert (problem or "0 bad") in capsys.readouterr().out
        assert run_all(path)["a"] == ("reused" if problem is None else "ran")
    assert set(run_all(path).values()) == {"reused"}
    assert cli.main(["verify", "--store", str(store)]) == 0


@pytest.mark.parametrize("meta, content", [
    ("manifest", "[]"), ("manifest", "null"), ("manifest", '{"key": 5}'), ("manifest", '{"status": "ok"}'),
    ("manifest", '{"status": "ok", "key": "KEY", "outputs": {"model": "model.onnx"}}'),
    ("last", "[]"), ("last", '{"key": null}'), ("digests", "[]"), ("digests", '{"x": "y"}'),
])
def test_metadata_of_the_wrong_shape_is_treated_as_absent(pipe, meta, content):
    path, store = pipe
    directory = published(store, "a")
    target = {"manifest": directory / "manifest.json", "last": store / "a" / "last.json",
              "digests": store / "digests.json"}[meta]
    target.write_text(content.replace("KEY", directory.name))
    statuses = run_all(path)
    assert statuses["a"] == ("ran" if meta == "manifest" else "reused")
    assert set(run_all(path).values()) == {"reused"}


def test_staging_of_dead_runs_is_removed_and_a_live_ones_kept(pipe):
    path, store = pipe
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    stale = store / "build" / f".tmp-0123456789ab-{HOST}-{pid}-xyz"
    live = store / "build" / f".tmp-0123456789ab-{HOST}-{os.getpid()}-xyz"
    other_host = store / "build" / f".tmp-0123456789ab-elsewhere-{pid}-xyz"
    for d in (stale, live, other_host):
        (d / "engines").mkdir(parents=True)
    run_all(path)
    assert not stale.exists() and live.exists() and other_host.exists()


def test_published_results_record_every_file(pipe):
    _, store = pipe
    manifest = json.loads((published(store, "build") / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["engines/fp16/engine.plan", "engines/fp32/engine.plan", "summary.md"]
    assert all(len(r["sha256"]) == 64 and r["size"] > 0 for k, r in manifest["files"].items() if k != "summary.md")


# --- --force (item 3) -------------------------------------------------------------------------------------------

def test_a_forced_run_that_fails_replaces_the_ok_result_and_keeps_its_report(write_yaml, tmp_path):
    flag = tmp_path / "fail-now"
    path = write_yaml(f"""
        version: 1
        name: forced
        model: models/cls.onnx
        stages:
          j: {{kind: "tests.stage_fns:judge", outputs: {{report: json}}, params: {{fail_if: '{flag}'}}}}
        """)
    assert run_all(path) == {"j": "ran"}
    flag.write_text("")
    from trtflow.errors import StageFailed
    with pytest.raises(StageFailed) as info:
        run_all(path, force=["j"])
    details = Path(str(info.value).split("(details: ")[1].rstrip(")"))
    assert details.read_text() == "# failed this time", "the failed report is reachable where the error says"
    assert json.loads((details.parent / "manifest.json").read_text())["status"] == "failed"
    assert plan_of(path)["j"] == ("run", f"its last run failed: {info.value}")
    flag.unlink()
    assert run_all(path) == {"j": "ran"}, "the failed verdict replaced the OK result: it is not reused"


def test_a_forced_nondeterministic_run_keeps_manifests_truthful(write_yaml, workdir):
    path = write_yaml("""
        version: 1
        name: nondet
        model: models/cls.onnx
        stages:
          r: {kind: "tests.stage_fns:random_model", outputs: {model: onnx}}
          c: {kind: "tests.stage_fns:count_bytes", outputs: {report: json}, inputs: {model: r}}
        """)
    run_all(path)
    assert run_all(path, force=["r"]) == {"r": "ran", "c": "ran"}
    store = workdir / ".trtflow"
    from trtflow.files import sha256
    model = published(store, "r") / "model.onnx"
    (c_dir,) = [d for d in (store / "c").iterdir() if d.is_dir() and json.loads(
        (store / "c" / "last.json").read_text())["key"] == d.name]
    recorded = json.loads((c_dir / "manifest.json").read_text())["inputs"]["model"]
    assert recorded["path"] == str(model) and recorded["digest"] == sha256(model), \
        "the downstream manifest records the digest of the file it read"


def test_publishing_over_a_concurrent_winner_returns_the_winners_manifest(pipe):
    path, store = pipe
    from trtflow.flows.store import LocalStore
    s = LocalStore(store)
    key = published(store, "a").name
    staging = s.staging("a", key)
    (staging / "model.onnx").write_bytes(b"another run's bytes")
    mine = Manifest.model_validate({"status": "ok", "key": key, "outputs": {"model": {"path": "model.onnx",
                                                                                      "digest": "mine"}}})
    directory, manifest = s.publish("a", key, staging, mine)
    assert manifest.outputs["model"].digest != "mine" and not staging.exists()
    assert (directory / "model.onnx").read_bytes() != b"another run's bytes"


def test_a_run_that_loses_the_race_to_the_rename_adopts_the_winner(pipe, monkeypatch):
    """Issue #27: the other run's rename came between our `exists()` and our own rename (1 in 36 real races):
    `OSError: Directory not empty` as an unexpected error. Now it is the winner found on the second look."""
    from trtflow.flows import store as store_module
    path, store = pipe
    s = store_module.LocalStore(store)
    key = published(store, "a").name
    winner = s.staging("a", key)
    shutil.copytree(published(store, "a"), winner, dirs_exist_ok=True)
    shutil.rmtree(published(store, "a"))  # the key is not published yet when we look
    staging = s.staging("a", key)
    (staging / "model.onnx").write_bytes(b"our bytes")
    real_replace = os.replace

    def theirs_first(src, dst):
        if Path(dst) == s.path("a", key) and Path(src) == staging:
            real_replace(winner, dst)  # the other run renames its result into place first
        return real_replace(src, dst)

    monkeypatch.setattr(store_module.os, "replace", theirs_first)
    mine = Manifest.model_validate({"status": "ok", "key": key, "outputs": {"model": {"path": "model.onnx",
                                                                                      "digest": "mine"}}})
    directory, manifest = s.publish("a", key, staging, mine)
    assert manifest.outputs["model"].digest != "mine" and not staging.exists()
    assert (directory / "model.onnx").read_bytes() != b"our bytes"
    monkeypatch.undo()
    assert set(run_all(path).values()) == {"reused"}


def test_a_failed_verdict_that_loses_the_race_to_an_ok_result_adopts_it(write_yaml, tmp_path, monkeypatch):
    """Issue #42 (bench/load.py, 8 runs on one local store): another run of the same key passed its benchmark gate
    and published first; this run's gate failed (its throughput measured under heavier load). The store kept the
    OK result, which the next run reuses, yet this run exited 1 pointing at that result's summary, which says
    'passed'. It adopts the winner's result, as an OK result that loses the race does, and says why."""
    from trtflow.flows import runner as runner_module
    from trtflow.flows.runner import Runner
    from trtflow.pipelines.loader import load_pipeline

    flag = tmp_path / "fail-now"
    path = write_yaml(f"""
        version: 1
        name: raced
        model: models/cls.onnx
        stages:
          j: {{kind: "tests.stage_fns:judge", outputs: {{report: json}}, params: {{fail_if: '{flag}'}}}}
        """)
    real = runner_module.call_stage

    def the_other_run_first(*args, **kwargs):
        monkeypatch.setattr(runner_module, "call_stage", real)
        assert run_all(path) == {"j": "ran"}, "the other run: its verdict OK, published first"
        flag.write_text("")  # this run's verdict: failed
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_module, "call_stage", the_other_run_first)
    runner = Runner(load_pipeline(path))
    runner.store.ensure_writable()
    outcome = runner.run_stage("j", {})
    assert outcome.status == "reused" and outcome.manifest.ok and outcome.summary == "# ok", outcome
    assert outcome.reason == "another run published it first (this run's own verdict: judged wrong this time)"
    assert [d.name for d in (tmp_path / ".trtflow" / "j").iterdir() if d.is_dir()] == [outcome.key], \
        "one result, the winner's; this run's staging is gone"
    assert plan_of(path)["j"][0] == "reuse"


def enforce_write_permission(monkeypatch) -> None:
    """Root may remove entries of a directory without write permission; a user may not. Under root (CI), removal
    is refused as it would be for the user (EACCES), so the test sees what users see."""
    if os.geteuid() != 0:
        return

    def guarded(real):
        def call(path, *, dir_fd=None):
            parent = os.fstat(dir_fd) if dir_fd is not None else os.stat(os.path.dirname(os.path.abspath(path)))
            if not parent.st_mode & stat.S_IWUSR:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real(path, dir_fd=dir_fd)
        return call

    monkeypatch.setattr(os, "unlink", guarded(os.unlink))
    monkeypatch.setattr(os, "rmdir", guarded(os.rmdir))


def test_replacing_a_result_made_read_only_leaves_no_trash(pipe, monkeypatch):
    """Issue #27: a result someone protected with `chmod -R a-w` was replaced by a forced run, and its
    `.trash-*` stayed behind."""
    path, store = pipe
    enforce_write_permission(monkeypatch)
    directory = published(store, "a")
    for d in [directory, *(p for p in directory.rglob("*") if p.is_dir())]:
        d.chmod(0o555)
    assert run_all(path, force=["a"])["a"] == "ran"
    assert not list(store.glob("*/.trash-*")) and not list(store.glob("*/.tmp-*"))
    assert set(run_all(path).values()) == {"reused"}


# --- shared and read-only stores (item 6) --------------------------------------------------------------------

def test_published_results_respect_the_umask(pipe):
    path, store = pipe
    from trtflow.flows.store import umask
    mask = os.umask(0o022)
    os.umask(mask)
    assert umask() == mask  # read without setting it
    for stage in ("a", "build", "c"):
        assert published(store, stage).stat().st_mode & 0o777 == 0o777 & ~mask


def _refused(path: str) -> bool:
    """This user may not read `path`: a folder above it it cannot enter, or the file's own mode (not: absent)."""
    try:
        os.stat(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return not os.access(path, os.R_OK)


def _as_reader(fn, folder: Path):
    """fn() where the store cannot be written: as user nobody when we are root (permissions do not bind root),
    else after removing write permission. Returns (fn's result or the exception it raised, what the reader was
    refused outside `folder`).

    The reader is this process forked and turned into nobody: it runs the interpreter and the modules already
    loaded, and needs on disk only what fn reads. Each file it opened outside `folder` that nobody may not read
    (the checkout, the virtual environment or the interpreter under a folder only their owner enters) is
    returned: the test then says which, instead of a refusal that looks like the store's."""
    import multiprocessing
    if os.geteuid() != 0:
        try:
            return fn(), []
        except Exception as exc:  # noqa: BLE001 - returned for the test to inspect
            return exc, []
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    inside = str(folder) + os.sep

    def target():
        os.setgroups([])  # root's groups too: the reader is nobody and nothing else
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        refused: list[str] = []

        def audit(event: str, args: tuple) -> None:
            if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
                path = os.path.abspath(os.fsdecode(args[0]))
                if not path.startswith(inside) and _refused(path):
                    refused.append(path)
        sys.addaudithook(audit)  # this process only: it ends when fn returns
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001
            result = exc
        child.send((result, refused))
    proc = ctx.Process(target=target)
    proc.start()
    result = parent.recv()
    proc.join()
    return result


def test_a_read_only_store_serves_a_fully_cached_run(write_yaml, workdir, tmp_path):
    """A store others may read but not write (as root: the run is repeated as user nobody) serves a fully cached
    run, and says it is read-only where a stage must run. Everything the reader reads is in a folder of the test's
    own that every user can enter (`reachable_tmp`): the model repo, its store and the stage functions, copied
    beside the pipeline (where a user's own code lives), not read from the checkout, which may sit under a folder
    only its owner enters (a 0700 home, a `mktemp -d` folder)."""
    import shutil
    import stat
    shared = reachable_tmp("trtflow-shared-")  # outside pytest's 0700 directory, for `nobody`
    try:
        repo = shared / "repo"
        shutil.copytree(workdir, repo)
        shutil.copy(stage_fns.__file__, repo / "reader_stage_fns.py")
        path = repo / "pipeline.yaml"
        path.write_text(PIPE.replace("tests.stage_fns:", "reader_stage_fns:"))
        for p in [repo, *repo.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if p.is_dir() else 0))
        if os.geteuid() == 0 and closed_to_others(repo) is not None:
            need(f"user nobody cannot enter {closed_to_others(repo)}, above the test's folder {repo}")
        assert set(run_all(path).values()) == {"ran"}
        store = repo / ".trtflow"
        if os.geteuid() != 0:
            for p in [store, *store.rglob("*")]:
                p.chmod(p.stat().st_mode & ~0o222)
        before = sorted(str(p) for p in store.rglob("*"))

        def as_reader(fn):
            result, refused = _as_reader(fn, shared)
            if refused:
                need(f"user nobody, the store's reader, could not read {refused[0]} (outside the test's folder)")
            return result
        assert as_reader(lambda: run_all(path)) == {"a": "reused", "build": "reused", "c": "reused"}
        error = as_reader(lambda: run_all(path, overrides=["stages.c.params.x=1"]))
        assert str(error) == (f"stage 'c' must run but the artifact store at {store} is read-only; give a "
                              f"writable one with --store")
        assert sorted(str(p) for p in store.rglob("*")) == before
    finally:
        for p in [shared, *shared.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
        shutil.rmtree(shared, ignore_errors=True)


def test_verify_leaves_the_shared_caches_alone(tmp_path):
    """`<root>/shared/` holds caches stages share across keys (the benchmark's baselines, the timing cache): they
    have no manifest and are not results, so verify neither counts them bad nor removes them."""
    from trtflow.flows.store import LocalStore
    store = LocalStore(tmp_path / "store")
    store.ensure_writable()
    (tmp_path / "store" / "shared" / "benchmark").mkdir(parents=True)
    (tmp_path / "store" / "shared" / "benchmark" / "baselines.json").write_text("{}")
    staging = store.staging("s", "f0" * 16)
    (staging / "out.bin").write_bytes(b"x")
    store.publish("s", "f0" * 16, staging, Manifest(key="f0" * 16, status="ok", outputs={}))
    report = store.verify(repair=True)
    assert [(r.stage, r.status) for r in report.rows] == [("s", VerifyStatus.OK)]
    assert (tmp_path / "store" / "shared" / "benchmark" / "baselines.json").is_file()


# --- nothing outside what trtflow owns is deleted or read (issue #27, data loss and security) ----------------------

def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root`: files' bytes, symlinks' targets, directories as 'dir' (links not followed)."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else ("dir" if p.is_dir() else p.read_bytes())
    return out


def test_verify_repair_refuses_a_directory_that_is_not_a_store(tmp_path, capsys):
    """A model repo passed as --store by mistake: refused before anything is read, nothing removed."""
    import shutil

    from tests.assets import EXAMPLES
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES, repo, ignore=shutil.ignore_patterns(".trtflow"))
    (repo / "stages" / "prepare").mkdir(parents=True)  # a folder named like a stage, of the repo's own
    (repo / "stages" / "prepare" / "notes.md").write_text("ours")
    before = _tree(repo)
    for argv in (["verify", "--store", str(repo), "--repair"], ["verify", "--store", str(repo)]):
        code = cli.main(argv)
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert code == 2 and len(err) == 1, err
        assert f"{repo} is not a trtflow artifact store" in err[0] and "nothing was checked or removed" in err[0]
    assert _tree(repo) == before


def test_verify_repair_removes_only_what_trtflow_made_and_follows_no_symlink(pipe, tmp_path, capsys):
    path, store = pipe
    photos = tmp_path / "photos"  # the user's own data, reachable from the store through symlinks
    (photos / "0123456789abcdef0123456789abcdef").mkdir(parents=True)  # named like a result, no manifest
    (photos / "0123456789abcdef0123456789abcdef" / "cat.png").write_bytes(b"png")
    (photos / ".tmp-0123-somehost-1-x").mkdir()  # named like staging
    (photos / "dog.jpg").write_bytes(b"jpg")
    (store / "photos").symlink_to(photos)  # a stage directory that is a symlink
    (store / "a" / "fedcba9876543210fedcba9876543210").symlink_to(photos / "0123456789abcdef0123456789abcdef")
    (store / "docs").mkdir()  # a folder trtflow did not make, inside the store
    (store / "docs" / "README.md").write_text("how we use this store")
    corrupt = published(store, "c") / "report.json"
    corrupt.write_text(corrupt.read_text() + " ")
    outside, docs = _tree(photos), _tree(store / "docs")

    assert cli.main(["verify", "--store", str(store), "--repair"]) == 0
    out = capsys.readouterr().out
    assert "1 removed" in out and "left alone" in out and "photos (a symlink)" in out, out
    assert _tree(photos) == outside and _tree(store / "docs") == docs, "nothing of the user's was touched"
    assert (store / "photos").is_symlink() and (store / "a" / "fedcba9876543210fedcba9876543210").is_symlink()
    assert not (store / "c").joinpath(corrupt.parent.name).exists(), "the corrupt result was removed"
    assert run_all(path)["c"] == "ran"


def test_a_file_dropped_into_a_published_result_is_never_served(pipe):
    """An engine injected into a published build result: the result no longer matches its manifest, so it is
    rebuilt (and the injected file never read)."""
    path, store = pipe
    build = published(store, "build")
    (build / "engines" / "fp16" / "injected.plan").write_bytes(b"not built by trtflow")
    assert plan_of(path)["build"] == ("run", "its stored result failed verification: "
                                          "engines/fp16/injected.plan is not one of its recorded files")
    assert run_all(path) == {"a": "reused", "build": "ran", "c": "reused"}
    assert not list(published(store, "build").rglob("injected.plan"))


@pytest.mark.parametrize("bad_path", ["/tmp/PWNED-abs", "../../PWNED-rel", "sub/../../PWNED"])
def test_a_manifest_naming_a_path_outside_its_result_is_not_a_manifest(pipe, bad_path):
    path, store = pipe
    directory = published(store, "a")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][bad_path] = manifest["files"].pop("model.onnx")
    (directory / "manifest.json").write_text(json.dumps(manifest))
    assert plan_of(path)["a"] == ("run", f"{directory / 'manifest.json'} is not a trtflow manifest; ignored")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"] = {"model.onnx": manifest["files"].pop(bad_path)}
    manifest["outputs"]["model"]["path"] = bad_path
    (directory / "manifest.json").write_text(json.dumps(manifest))
    assert plan_of(path)["a"][0] == "run"


@pytest.mark.slow
def test_a_stage_that_outputs_a_symlink_is_one_line_and_publishes_nothing(write_yaml, workdir):
    from trtflow.errors import StageError
    path = write_yaml("""
        version: 1
        name: link
        model: models/cls.onnx
        stages:
          s: {kind: "tests.stage_fns:write_symlink", outputs: {engines: dir}}
        """)
    with pytest.raises(StageError, match="the stage wrote a symlink, engines/b.plan, among its outputs"):
        run_all(path)
    assert [p.name for p in (workdir / ".trtflow" / "s").iterdir()] == ["last.json"]
