"""A stage's own process, or the ONNX Runtime probe it started, killed with SIGKILL at 20 moments of a real run
(FP16 precision on the PP-OCR classifier, which probes its candidate graphs): a result the store serves afterwards is always the clean
run's (issue #27)."""
from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.test_faults import descendants
from trtflow import procfs

STAGES = """
version: 1
name: killstages
model: models/cls.onnx
stages:
  fp16: {kind: precision, to: fp16, preflight: "off", inputs: {model: source}}
"""
MOMENTS = 20


@pytest.mark.slow
def test_sigkill_of_stage_processes_and_probes_never_changes_a_served_result(workdir):
    """Issue #27: a stage's process or its ONNX Runtime probe killed at a random moment (the OOM killer) once let
    the run publish an FP16 variant with nodes kept in FP32 "because ONNX Runtime rejected them", under the key of
    unchanged inputs, and the next run reused it. 20 moments, each killing a stage's process or a probe that is
    running then: every result the store would serve afterwards is the clean run's, byte for byte."""
    from tests.test_runner import run_all
    from trtflow.errors import TrtflowError
    from trtflow.flows.store import LocalStore

    path = workdir / "pipeline.yaml"
    path.write_text(STAGES)
    assert run_all(path, ["artifacts=reference"]) == {"fp16": "ran"}
    t0 = time.monotonic()
    assert run_all(path, ["artifacts=warm"]) == {"fp16": "ran"}  # the fork server already up
    full = time.monotonic() - t0
    expected = {"fp16": _served(LocalStore(workdir / "reference"), "fp16")}

    rng = random.Random(27)
    killed, failed, n = [], 0, 0
    # trials until 20 kills landed, half in the life of an ONNX Runtime probe (a short part of the run): on a busy
    # machine a moment can fall after the process it aims at has ended
    while (killed.count("probe") + killed.count("stage") < MOMENTS or min(killed.count("probe"),
                                                                          killed.count("stage")) < MOMENTS // 4):
        assert n < 3 * MOMENTS, f"fewer than {MOMENTS} kills landed in {n} trials: {killed}"
        store = f"store{n}"
        aim = "probe" if killed.count("probe") <= killed.count("stage") else "stage"
        victim = _Killer(rng.uniform(0, 0.4), rng, "probe") if aim == "probe" else _Killer(rng.uniform(0, full), rng)
        victim.start()
        try:
            run_all(path, [f"artifacts={store}"])
        except TrtflowError:
            failed += 1
        victim.stop()
        killed.append(victim.killed)
        served = LocalStore(workdir / store)
        got = _served(served, "fp16")
        assert got is None or got == expected["fp16"], (n, victim.killed)
        n += 1
    assert failed >= killed.count("probe"), "a run whose probe was killed fails (as a crash)"
    # a store left by a killed run completes with the clean run's results
    assert set(run_all(path, [f"artifacts=store{n - 1}"]).values()) <= {"ran", "reused"}
    assert {s: _served(LocalStore(workdir / f"store{n - 1}"), s) for s in expected} == expected


def _served(store, stage: str) -> dict | None:
    """What the store would serve for `stage`: its published OK result's models and report (timings dropped)."""
    last = store.last(stage)
    manifest = store.lookup(stage, last.key).manifest if last else None
    if manifest is None:
        return None
    directory = store.path(stage, manifest.key)
    report = json.loads((directory / manifest.outputs["report"].path).read_text())
    return {"key": manifest.key, "model": manifest.outputs["model"].digest, "report": _untimed(report)}


def _untimed(x):
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if k not in ("seconds", "timings")}
    return [_untimed(v) for v in x] if isinstance(x, list) else x


class _Killer(threading.Thread):
    """After `moment` seconds, SIGKILL one process that a stage runs in at that moment: a stage's own process
    (forked by the fork server) or a helper it started (`python -m trtflow.stages...`: the ONNX Runtime probe).
    With `prefer`, the moment counts from when such a helper appears, and that helper is the victim."""

    def __init__(self, moment: float, rng: random.Random, prefer: str | None = None):
        super().__init__(daemon=True)
        self.moment, self.rng, self.prefer, self.killed = moment, rng, prefer, None
        self.done = threading.Event()

    def run(self) -> None:
        while self.prefer and self.prefer not in self._candidates().values():
            if self.done.wait(0.01):
                return
        if self.done.wait(self.moment):
            return
        while not self.done.is_set():
            candidates = self._candidates()
            preferred = {p: w for p, w in candidates.items() if w == self.prefer}
            if candidates:
                pid, what = self.rng.choice(sorted((preferred or candidates).items()))
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed = what
                except ProcessLookupError:
                    continue
                return
            time.sleep(0.01)

    @staticmethod
    def _candidates() -> dict[int, str]:
        me = os.getpid()
        out = {}
        for pid in descendants(me):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            found = procfs.stat(pid)
            if found is None:
                continue
            args = cmdline.split(b"\0")
            if len(args) > 2 and args[1] == b"-m" and args[2].startswith(b"trtflow.stages."):
                out[pid] = args[2].decode().rsplit(".", 1)[-1]  # probe, preflight, ... (`python -m trtflow.stages...`)
            elif b"multiprocessing.forkserver" in cmdline and found.parent != me:
                out[pid] = "stage"
        return out

    def stop(self) -> None:
        self.done.set()
        self.join()
