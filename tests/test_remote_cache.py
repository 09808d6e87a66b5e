"""A remote store's local cache is a cache of the bucket, never a result of its own (issue #50): a cached result is
served only when the bucket holds it too (one read of its manifest); one the bucket lost is hashed in full and
published again, or, when that fails or the store is read-only, not used. Against moto's S3 server (a real HTTP
server, as in tests/test_shared_store.py), whose request log counts what each lookup costs."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.test_shared_store import _manifest, _moto_server, _staged, _store
from trtflow.errors import StoreError
from trtflow.flows.manifest import MANIFEST

pytest.importorskip("s3fs")

REQUEST = re.compile(r'"(GET|PUT|POST|DELETE|HEAD) (\S+) HTTP')


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's server, with its log: (the AWS_* variables that reach it, the log's path)."""
    tmp = tmp_path_factory.mktemp("moto")
    with _moto_server(tmp) as env:
        yield env, tmp / "moto.log"


class Bucket:
    def __init__(self, name: str, fs, log: Path):
        self.name, self.fs, self.log = name, fs, log
        self.url = f"s3://{name}/store"

    def requests(self) -> int:
        """A mark in the server's log: what `since` counts from."""
        return len(self.log.read_text().splitlines())

    def since(self, mark: int) -> list[tuple[str, str]]:
        """(method, path) of every request the server answered after `mark`."""
        return [(m.group(1), m.group(2)) for line in self.log.read_text().splitlines()[mark:]
                if (m := REQUEST.search(line))]

    def objects(self) -> list[str]:
        return sorted(p.split("/store/", 1)[1] for p in self.fs.find(f"{self.name}/store"))

    def recreate(self) -> None:
        """The bucket deleted (every object first) and created again, empty."""
        self.fs.rm(f"{self.name}/store", recursive=True)
        self.fs.rmdir(self.name)  # (S3 deletes only an empty bucket)
        self.fs.invalidate_cache()
        self.fs.mkdir(self.name)
        assert self.objects() == []


@pytest.fixture
def bucket(s3, monkeypatch, request):
    import hashlib

    import s3fs

    env, log = s3
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    name = "rc-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:12]
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    fs.mkdir(name)
    return Bucket(name, fs, log)


def _published(store, key: str, content: bytes):
    """A tiny result of stage 's' published to the store (and so in its machine's cache)."""
    _, manifest = store.publish("s", key, _staged(store, "s", key, content), _manifest(key, content))
    return manifest


def _remote_files(bucket: Bucket, key: str) -> dict[str, bytes]:
    """The files the bucket's manifest of `key` names, by path (read as another machine would)."""
    manifest = json.loads(bucket.fs.cat_file(f"{bucket.name}/store/s/{key}/{MANIFEST}"))
    return {rel: bucket.fs.cat_file(f"{bucket.name}/store/s/{key}/{manifest['blobs']}/{rel}")
            for rel in manifest["files"]}


@pytest.mark.slow
def test_a_result_the_bucket_holds_is_served_from_the_cache_for_one_read(bucket, tmp_path):
    key = "a1" * 16
    store = _store(bucket.url, tmp_path / "m1")
    published = _published(store, key, b"engine bytes")
    mark = bucket.requests()
    found = store.lookup("s", key)
    assert found.manifest is not None and found.manifest.files == published.files and found.note == ""
    assert bucket.since(mark) == [("GET", f"/{bucket.name}/store/s/{key}/{MANIFEST}")]  # one read; nothing sent
    mark = bucket.requests()
    assert store.peek("s", key).manifest is not None
    assert bucket.since(mark) == [("GET", f"/{bucket.name}/store/s/{key}/{MANIFEST}")]
    assert store.notes == []


@pytest.mark.slow
def test_a_result_the_bucket_lost_is_published_again_from_the_verified_copy(bucket, tmp_path):
    key = "b2" * 16
    store = _store(bucket.url, tmp_path / "m1")
    published = _published(store, key, b"engine bytes")
    bucket.recreate()

    planned = store.peek("s", key)  # plan: says what run will do, does nothing
    assert planned.manifest is not None and "will be verified and published again" in planned.note
    assert bucket.objects() == []

    found = store.lookup("s", key)
    assert found.manifest is not None and found.manifest.outputs == published.outputs
    assert found.note == f"missing from {bucket.url}: published again from this machine's verified copy"
    assert store.notes == [f"s {key[:8]} was missing from {bucket.url}: published again from this machine's "
                           f"verified copy"]
    assert _remote_files(bucket, key) == {"model.onnx": b"engine bytes"}
    # another machine fetches it from the bucket, verified; this one now reads the bucket's manifest only
    other = _store(bucket.url, tmp_path / "m2")
    assert other.lookup("s", key).manifest is not None
    assert (other.path("s", key) / "model.onnx").read_bytes() == b"engine bytes"
    mark = bucket.requests()
    again = store.lookup("s", key)
    assert again.manifest is not None and again.note == ""
    assert [m for m, _ in bucket.since(mark)] == ["GET"]


def test_an_altered_cached_copy_is_discarded_not_published(bucket, tmp_path):
    """Bit rot: the cached file changed and its stamps did not (the cheap check passes): the full hash before
    publishing it again catches it; the stage recomputes, and that result is published."""
    key = "c3" * 16
    store = _store(bucket.url, tmp_path / "m1")
    _published(store, key, b"engine bytes")
    bucket.recreate()
    directory = store.path("s", key)
    (directory / "model.onnx").write_bytes(b"engine bytez")
    st = (directory / "model.onnx").stat()
    record = json.loads((directory / MANIFEST).read_text())
    record["files"]["model.onnx"].update(mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)
    (directory / MANIFEST).write_text(json.dumps(record))
    assert store.cache.lookup("s", key).manifest is not None  # what the cache alone would have served

    mark = bucket.requests()
    found = store.lookup("s", key)
    assert found.manifest is None
    assert "failed verification (model.onnx changed content" in found.rejected and "discarded" in found.rejected
    assert any("failed verification" in n for n in store.notes)
    assert not directory.exists()
    assert [m for m, _ in bucket.since(mark)] == ["GET"] and bucket.objects() == []  # nothing published from it
    # the stage runs again: its result is published and served
    _published(store, key, b"engine bytes, again")
    assert _remote_files(bucket, key) == {"model.onnx": b"engine bytes, again"}
    assert store.lookup("s", key).manifest is not None


@pytest.mark.slow
def test_a_read_only_store_does_not_serve_what_only_the_cache_holds(bucket, tmp_path):
    key = "d4" * 16
    _published(_store(bucket.url, tmp_path / "m1"), key, b"engine bytes")
    bucket.recreate()
    from trtflow.flows.remote_store import RemoteStore

    store = RemoteStore(bucket.url, tmp_path / "m1")
    store.read_only = True  # what ensure_writable finds when the bucket denies writes
    mark = bucket.requests()
    for found in (store.peek("s", key), store.lookup("s", key)):
        assert found.manifest is None
        assert found.rejected == (f"not in the store at {bucket.url}: only this machine's cache holds it (the store "
                                  f"is read-only: it cannot be published again)")
    assert [m for m, _ in bucket.since(mark)] == ["GET", "GET"] and bucket.objects() == []
    assert (store.path("s", key) / "model.onnx").read_bytes() == b"engine bytes"  # the cache keeps it
    with pytest.raises(StoreError, match="read-only"):  # and the stage that must run says why it cannot
        store.staging("s", key)


def test_another_result_of_the_key_in_the_bucket_replaces_the_cached_copy(bucket, tmp_path):
    """A forced run on another machine published its own result of the key: this machine's cached one is not
    the store's any more."""
    key = "e5" * 16
    mine = _store(bucket.url, tmp_path / "m1")
    _published(mine, key, b"first engine")
    other = _store(bucket.url, tmp_path / "m2")
    _, forced = other.publish("s", key, _staged(other, "s", key, b"forced engine"), _manifest(key, b"forced engine"),
                              replace=True)
    planned = mine.peek("s", key)
    assert planned.manifest is not None and planned.manifest.blobs == forced.blobs
    assert "will be fetched in place of the cached copy" in planned.note
    found = mine.lookup("s", key)
    assert found.manifest is not None and found.manifest.outputs == forced.outputs
    assert "fetched in place of the cached copy" in found.note
    assert (mine.path("s", key) / "model.onnx").read_bytes() == b"forced engine"


@pytest.mark.slow
def test_a_failed_result_in_the_bucket_is_not_served_and_a_rerun_replaces_it(bucket, tmp_path):
    key = "f6" * 16
    mine = _store(bucket.url, tmp_path / "m1")
    _published(mine, key, b"ok engine")
    other = _store(bucket.url, tmp_path / "m2")
    failed = _manifest(key, b"failed engine").model_copy(update={"status": "failed"})
    other.publish("s", key, _staged(other, "s", key, b"failed engine"), failed, replace=True)
    found = mine.lookup("s", key)
    assert found.manifest is None and "is a failed run's" in found.rejected
    # the stage runs again (not forced): its OK result replaces the failed one (it raised StoreError before)
    _, placed = mine.publish("s", key, _staged(mine, "s", key, b"rerun engine"), _manifest(key, b"rerun engine"))
    assert placed.ok and _remote_files(bucket, key) == {"model.onnx": b"rerun engine"}
    assert (mine.path("s", key) / "model.onnx").read_bytes() == b"rerun engine"
    assert other.lookup("s", key).manifest.blobs == placed.blobs


def test_an_unreachable_bucket_is_an_error_not_the_cached_copy(bucket, tmp_path, monkeypatch):
    import socket

    key = "a7" * 16
    _published(_store(bucket.url, tmp_path / "m1"), key, b"engine bytes")
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    from trtflow.flows.remote_store import RemoteStore

    store = RemoteStore(bucket.url, tmp_path / "m1")
    for ask in (store.lookup, store.peek):
        with pytest.raises(StoreError, match=f"reading s/{key[:12]} failed: EndpointConnectionError"):
            ask("s", key)
    assert os.path.exists(store.path("s", key) / "model.onnx")


@pytest.mark.slow
def test_a_republish_that_loses_the_race_adopts_the_winners_result(bucket, tmp_path):
    """The bucket lost the result; while this machine checks, another one publishes its own result of the key:
    this machine's upload loses the conditional create, is removed, and the winner's result replaces the cached
    copy (the store's result is the one everyone reads)."""
    key = "b8" * 16
    mine = _store(bucket.url, tmp_path / "m1")
    _published(mine, key, b"my engine")
    bucket.recreate()
    other = _store(bucket.url, tmp_path / "m2")
    real = mine._remote_manifest
    calls = []

    def meanwhile(stage, k):  # the bucket is read (empty), then the other machine publishes before our create
        calls.append(k)
        if len(calls) == 1:
            found = real(stage, k)
            other.publish("s", key, _staged(other, "s", key, b"their engine"), _manifest(key, b"their engine"))
            return found
        return real(stage, k)
    mine._remote_manifest = meanwhile
    found = mine.lookup("s", key)
    assert found.manifest is not None and "another run published it again meanwhile" in found.note
    assert (mine.path("s", key) / "model.onnx").read_bytes() == b"their engine"
    assert _remote_files(bucket, key) == {"model.onnx": b"their engine"}
    writers = {p.split("/")[2] for p in bucket.objects() if p.count("/") >= 3}
    assert writers == {found.manifest.blobs}, "the loser's upload was removed"
