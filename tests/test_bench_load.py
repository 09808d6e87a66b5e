"""bench/load.py's reading of the Prefect server's log and of its request timings, and its table (the bench itself
runs many minutes: not here). The log lines are the server's own, from the bench's run at 8 runs on one store; the
timing lines are what bench/timed_server writes, checked here around a real ASGI app."""
from __future__ import annotations

from tests.assets import load_bench

LOG = '''\
INFO:     127.0.0.1:35420 - "POST /api/artifacts/ HTTP/1.1" 201 Created
INFO:     127.0.0.1:48006 - "GET /api/csrf-token?client=7c8237be HTTP/1.1" 422 Unprocessable Entity
02:14:54.430 | ERROR   | prefect.server - Encountered retryable exception in request:
Traceback (most recent call last):
sqlite3.OperationalError: database is locked
The above exception was the direct cause of the following exception:
sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked
INFO:     127.0.0.1:47992 - "POST /api/v2/concurrency_limits/increment-with-lease HTTP/1.1" 503 Service Unavailable
INFO:     127.0.0.1:47993 - "PATCH /api/flow_runs/1 HTTP/1.1" 500 Internal Server Error
INFO:     127.0.0.1:53620 - "WebSocket /api/events/in" [accepted]
02:15:55.072 | INFO    | prefect.server.services.scheduler - Scheduled 0 runs.
'''


TIMING = """\
12.50 201 POST /api/artifacts/
3.10 422 GET /api/csrf-token
950.00 503 POST /api/v2/concurrency_limits/increment-with-lease
40.00 500 PATCH /api/flow_runs/1
"""


def test_the_server_log_and_timings_are_read_into_requests_retried_failed_and_latency():
    load = load_bench("load").ServerLoad.of(TIMING, LOG)
    assert (load.requests, load.retried, load.failed) == (4, 1, 1)
    assert load.latencies == [12.5, 3.1, 950.0, 40.0] and round(load.p95_ms, 1) == 813.5
    assert load.causes == {"sqlite3.OperationalError: database is locked": 1,
                           "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked": 1}


def test_the_table_compares_p95_with_the_single_run_of_its_database_and_mode():
    bench = load_bench("load")
    assert bench.percentile([10.0, 20.0, 30.0, 40.0], 95) == 38.5  # numpy's linear default
    server = bench.ServerLoad.of(TIMING, LOG)
    rows = [bench.Row("sqlite", "own", 1, [0], 30.0, [30.0], server, 0, 700, 700, 250, None, 2.0),
            bench.Row("sqlite", "own", 2, [0, 1], 61.0, [40.0, 60.0], server, 2, 710, 1400, 260, None, 4.0),
            bench.Row("postgres", "own", 1, [0], 20.0, [20.0], server, 0, 700, 700, 240, 61.4, 1.0),
            bench.Row("postgres", "own", 2, [0, 0], 30.0, [30.0, 30.0], server, 0, 700, 1400, 240, 90.0, 1.0)]
    lines = bench.table(rows).splitlines()
    assert lines[2] == ("| sqlite | own | 1 | 0 x1 | 30.0 | 30.0 | 1.00 | 4 | 1 / 1 | 0 | 814 | 700 / 700 / 250 / "
                        "in server | 2.0 |")
    assert lines[3] == ("| sqlite | own | 2 | 0, 1 | 61.0 | 59.0 | 1.97 | 4 | 1 / 1 | 2 | 814 | 710 / 1400 / 260 / "
                        "in server | 4.0 |")
    assert lines[5] == ("| postgres | own | 2 | 0 x2 | 30.0 | 30.0 | 1.50 | 4 | 1 / 1 | 0 | 814 | 700 / 1400 / 240 / "
                        "90 | 1.0 |")


def test_the_timed_server_times_each_request_around_the_app(tmp_path, monkeypatch):
    """bench/timed_server's layer around a real ASGI app: one line per HTTP request, its status and path; other
    scopes (lifespan, websockets) pass untouched."""
    import asyncio
    import importlib.util

    from tests.test_layout import ROOT

    spec = importlib.util.spec_from_file_location("timed", ROOT / "bench" / "timed_server" / "sitecustomize.py")
    timed = importlib.util.module_from_spec(spec)
    monkeypatch.delenv("TRTFLOW_BENCH_TIMING", raising=False)
    spec.loader.exec_module(timed)
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])
        if scope["type"] == "http":
            await asyncio.sleep(0.05)
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"busy"})

    out = tmp_path / "timing.txt"
    wrapped = timed._timed(app, str(out))
    sent = []

    async def send(message):
        sent.append(message["type"])

    async def receive():
        return {"type": "http.request"}

    asyncio.run(wrapped({"type": "http", "method": "POST", "path": "/api/flow_runs/"}, receive, send))
    asyncio.run(wrapped({"type": "lifespan"}, receive, send))
    (line,) = out.read_text().splitlines()
    ms, status, method, path = line.split()
    assert float(ms) >= 50 and (status, method, path) == ("503", "POST", "/api/flow_runs/")
    assert seen == ["http", "lifespan"] and sent == ["http.response.start", "http.response.body"]
