"""bench/load.py's reading of the Prefect server's log and its table (the bench itself runs minutes: not here).
The log lines are the server's own, from the bench's run at 8 runs on one store."""
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


def test_the_server_log_is_read_into_requests_retried_and_failed():
    load = load_bench("load").ServerLoad.of(LOG)
    assert (load.requests, load.retried, load.failed) == (4, 1, 1)  # a WebSocket is not a request answered
    assert load.causes == {"sqlite3.OperationalError: database is locked": 1,
                           "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked": 1}


def test_the_table_compares_p95_with_the_single_run_of_its_mode():
    bench = load_bench("load")
    assert bench.percentile([10.0, 20.0, 30.0, 40.0], 95) == 38.5  # numpy's linear default
    server = bench.ServerLoad.of(LOG)
    rows = [bench.Row("own", 1, [0], 30.0, [30.0], server, 0, 700, 700, 250, 2.0),
            bench.Row("own", 2, [0, 1], 61.0, [40.0, 60.0], server, 2, 710, 1400, 260, 4.0)]
    lines = bench.table(rows).splitlines()
    assert lines[2] == "| own | 1 | 0 x1 | 30.0 | 30.0 | 1.00 | 4 | 1 / 1 | 0 | 700 / 700 / 250 | 2.0 |"
    assert lines[3] == "| own | 2 | 0, 1 | 61.0 | 59.0 | 1.97 | 4 | 1 / 1 | 2 | 710 / 1400 / 260 | 4.0 |"
