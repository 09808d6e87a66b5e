"""bench/load.py's timing of Prefect's server: put on PYTHONPATH of the server's process only, it wraps the app
`prefect.server.api.server.create_app` makes in an ASGI layer that appends one line per HTTP request to the file
TRTFLOW_BENCH_TIMING names: `<ms> <status> <method> <path>` (the time from the request's arrival to the end of its
response). Uvicorn's access log names each request and its status, not how long it took.

Nothing else changes: the server is started as trtflow starts it (`trtflow server start`), on the same database.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time

TARGET = "prefect.server.api.server"


def _timed(app, path: str):
    async def timed(scope, receive, send):
        if scope.get("type") != "http":
            return await app(scope, receive, send)
        started, status = time.perf_counter(), [0]

        async def sending(message):
            if message.get("type") == "http.response.start":
                status[0] = message.get("status", 0)
            await send(message)
        try:
            await app(scope, receive, sending)
        finally:
            ms = (time.perf_counter() - started) * 1000
            line = f"{ms:.2f} {status[0]} {scope.get('method', '-')} {scope.get('path', '-')}\n"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
    return timed


class _Wrap(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        out = os.environ["TRTFLOW_BENCH_TIMING"]

        def exec_module(module):
            run(module)
            make = module.create_app

            def create_app(*args, **kwargs):
                return _timed(make(*args, **kwargs), out)
            module.create_app = create_app
        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("TRTFLOW_BENCH_TIMING"):
    sys.meta_path.insert(0, _Wrap())
