"""Where the test suite's CPU goes, per test, across every process a test starts (issue #54: the suite's ten
minutes on two cores are CPU-bound, so its time is its CPU).

pytest's own timings give wall time, which on a busy two-core machine says how long a test waited as much as what
it cost; `resource.getrusage(RUSAGE_CHILDREN)` misses what a test's processes leave unreaped (multiprocessing's fork
server and the stages it forks, Prefect's flow-run processes). So this runs the suite as the README does, with
this module as a pytest plugin that records when each test ran in which xdist worker, and samples every process's
CPU time from /proc twice a second: a process's CPU goes to the test its worker ran at that moment (found through
its parent processes), or stays "outside any test" (the test run's Prefect server, started by the controlling
process, and anything reparented away from its worker). Processes that live less than a sample apart are missed:
the table says how much of the machine's CPU over the run it accounts for.

    python bench/suite_cpu.py [PYTEST ARGS ...]      (default: the README's `-q`)

Prints the suite's wall time and the machine's CPU over it, then tables of CPU by test file, by test and by
process (each share of the CPU accounted for, the run's own baseline). Linux only (/proc)."""
from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from trtflow import procfs

EVENTS = "TRTFLOW_BENCH_SUITE_EVENTS"  # the plugin's file: one line per test
SAMPLE_S = 0.5


# --- the plugin: in each xdist worker, when each test ran ---------------------------------------------------------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001 - pytest's hook signature
    start = time.monotonic()
    yield
    if path := os.environ.get(EVENTS):
        with open(path, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "pid": os.getpid(), "start": start, "end": time.monotonic()})
                    + "\n")


# --- the sampler ----------------------------------------------------------------------------------------------------

def _process_name(pid: str) -> str:
    """What a process is: `python -m <module>` by its module, a fork server's child as the fork server, else its
    program's name."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    if not argv:
        return "?"
    program = os.path.basename(argv[0])
    if not program.startswith("python"):
        return program[:40]
    if "-m" in argv[:-1]:
        return "python -m " + argv[argv.index("-m") + 1][:60]
    if "-c" in argv[:-1]:
        code = argv[argv.index("-c") + 1]
        if "multiprocessing.forkserver" in code:
            return "multiprocessing fork server (stage processes)"
        if "exec(eval(sys.stdin.readline()))" in code:
            return "pytest worker"
        return "python -c"
    script = next((a for a in argv[1:] if not a.startswith("-")), "")
    return "python " + os.path.basename(script)[:60]


def _machine_cpu() -> float:
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    return procfs.seconds(user + nice + system + irq + softirq)


class Sampler(threading.Thread):
    """Every process's CPU since the last sample, with the time and the pytest worker it descends from."""

    def __init__(self, controller: int):
        super().__init__(daemon=True)
        self.controller, self.samples, self.stopped = controller, [], threading.Event()
        self.seen: dict[tuple[int, int], list] = {}  # (pid, start) -> [name, cpu at the last sample]
        self.workers: set[int] = {controller}  # with `-n 0` the tests run in pytest's own process

    def run(self) -> None:
        first = True
        while not self.stopped.wait(0 if first else SAMPLE_S):
            now, parents = time.monotonic(), {}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    found = procfs.stat(pid)
                    if found is None:
                        continue  # gone between listing and reading
                    parent, cpu = found.parent, procfs.seconds(found.cpu_ticks)
                    parents[int(pid)] = parent
                    key = (int(pid), found.started)
                    if key not in self.seen:  # (a process older than the run: none of its CPU so far)
                        self.seen[key] = [_process_name(pid), cpu if first else 0.0]
                        if parent == self.controller and self.seen[key][0] == "pytest worker":
                            self.workers.add(int(pid))
                    name, before = self.seen[key]
                    self.seen[key][1] = cpu
                    if cpu > before:
                        self.samples.append((now, self._worker_of(int(pid), parents), name, cpu - before))
                except OSError:
                    continue  # gone before its command line was read
            first = False

    def _worker_of(self, pid: int, parents: dict[int, int]) -> int | None:
        for _ in range(64):
            if pid in self.workers:
                return pid
            if pid <= 1:
                return None
            if pid not in parents:
                found = procfs.stat(pid)
                if found is None:
                    return None
                parents[pid] = found.parent
            pid = parents[pid]
        return None


# --- the run and its tables -------------------------------------------------------------------------------------

def _test_at(runs: dict[int, list], starts: dict[int, list[float]], worker: int | None, when: float) -> str:
    spans = runs.get(worker, [])
    if not spans:  # the controlling process's own (the test run's Prefect server), or reparented away
        return "(outside any test)"
    i = bisect.bisect_right(starts[worker], when) - 1
    if i >= 0 and when <= spans[i][1] + SAMPLE_S:
        return spans[i][2]
    return "(a worker: its start, collection, between tests)"


def _table(title: str, rows: Counter, total: float, top: int) -> None:
    print(f"\n| {title} | CPU s | share |\n|---|---:|---:|")
    for name, cpu in rows.most_common(top):
        print(f"| {name} | {cpu:.1f} | {cpu / total:.1%} |")


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="trtflow-suite-cpu-") as tmp:
        events = Path(tmp) / "events.jsonl"
        env = {**os.environ, EVENTS: str(events)}
        cpu0, wall0 = _machine_cpu(), time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "bench.suite_cpu", *(argv or ["-q"])],
                                cwd=root, env=env)
        sampler = Sampler(proc.pid)
        sampler.start()
        code = proc.wait()
        sampler.stopped.set()
        sampler.join()
        wall, machine = time.monotonic() - wall0, _machine_cpu() - cpu0
        runs: dict[int, list] = defaultdict(list)
        if events.exists():
            for line in events.read_text().splitlines():
                e = json.loads(line)
                runs[e["pid"]].append((e["start"], e["end"], e["test"]))
    for spans in runs.values():
        spans.sort()
    starts = {worker: [s[0] for s in spans] for worker, spans in runs.items()}
    by_test, by_file, by_process = Counter(), Counter(), Counter()
    for when, worker, name, cpu in sampler.samples:
        test = _test_at(runs, starts, worker, when)
        by_test[test] += cpu
        by_file[test.split("::")[0]] += cpu
        by_process[name] += cpu
    total = sum(by_test.values())
    print(f"\nsuite: exit {code}, {wall:.0f} s wall; the machine's CPU over it {machine:.0f} s "
          f"({machine / wall:.2f} cores busy); accounted for here {total:.0f} s ({total / machine:.0%})")
    _table("test file", by_file, total, 40)
    _table("test", by_test, total, 40)
    _table("process", by_process, total, 25)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
