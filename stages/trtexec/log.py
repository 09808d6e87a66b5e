"""trtexec's text output as numbers, for every layout from TensorRT 7 to 11.

- 8.2 and later: `=== Performance summary ===`, then `Throughput: N qps` and one line per measure
  (`Latency: min = .. ms, max = .., mean = .., median = .., percentile(90%) = .., ...`), `Total Host Walltime`,
  `Total GPU Compute Time` and `* ...` warnings about the measurement.
- 7.x and 8.0: blocks (`Host Latency`, `Enqueue Time`, `GPU Compute`) of `min: X ms (end to end Y ms)` lines and
  `percentile: X ms at 99% (...)`, with `throughput:`, `walltime:` and `total compute time:` inside them; and
  `Average on N runs - GPU latency: ...` trace lines (used when a log was cut before the blocks).
- Before 7: `Average over N runs is X ms (host walltime is Y ms, 99% percentile time is Z).`

Lines are found by trtexec's severity tag (`[I]`, `[W]`, `[E]`), so a prefix another logger adds, Markdown
indentation and Windows line ends do not matter. A log may hold several runs (`&&&& RUNNING` each): one result
per run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from trtflow.stages.trtexec.result import Layer, PerfResult

MEASURES = {  # the names trtexec has printed -> our key
    "latency": "latency_ms", "host latency": "latency_ms", "end-to-end host latency": "end_to_end_ms",
    "enqueue time": "enqueue_ms", "h2d latency": "h2d_ms", "gpu compute time": "gpu_compute_ms",
    "gpu compute": "gpu_compute_ms", "d2h latency": "d2h_ms",
}

_TAG = re.compile(r"\[([IWEVF])\] ?(.*)$")
_STATUS = re.compile(r"&&&& (RUNNING|PASSED|FAILED|WAIVED)\b(.*)$")
_N = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_NUM = f"({_N})"
_VERSION_DOTTED = re.compile(r"TensorRT(?:-RTX)? version:? (\d+(?:\.\d+)*)", re.I)  # 8.0 printed "8003"
_VERSION_PACKED = re.compile(r"\[TensorRT(?:-RTX)? v(\d{4,6})\]")
_ENTRY = re.compile(rf"(min|max|mean|median|percentile\({_NUM}%\))\s*[=:]\s*{_NUM}\s*ms")
_LINE_MEASURE = re.compile(r"^([A-Za-z0-9 -]+?)\s*:\s*(.*(?:min|max|mean|median|percentile).*)$")
_THROUGHPUT = re.compile(rf"^throughput:\s*{_NUM}\s*qps", re.I)
_HOST_WALLTIME = re.compile(rf"^(?:Total Host Walltime|walltime):\s*{_NUM}\s*s\b", re.I)
_GPU_TOTAL = re.compile(rf"^(?:Total GPU Compute Time|total compute time):\s*{_NUM}\s*s\b", re.I)
_BLOCK_STAT = re.compile(rf"^(min|max|mean|median):\s*{_NUM}\s*ms(?:\s*\(end to end\s*{_NUM}\s*ms\))?")
_BLOCK_PCT = re.compile(rf"^percentile:\s*{_NUM}\s*ms at\s*{_NUM}%(?:\s*\(end to end\s*{_NUM}\s*ms at\s*{_NUM}%\))?")
# 7.x/8.x print the end-to-end latency in the trace; 10.x prints only the enqueue time
_TRACE = re.compile(rf"^Average on (\d+) runs - GPU latency: {_NUM} ms - Host latency: {_NUM} ms "
                    rf"\((?:end to end {_NUM} ms, )?enqueue {_NUM} ms\)")
_OLD_AVERAGE = re.compile(rf"Average over (\d+) runs is {_NUM} ms \(host walltime is {_NUM} ms, "
                          rf"{_NUM}% percentile time is {_NUM}")
_PROFILE_START = re.compile(r"^=== Profile \((\d+) iterations ?\) ===")
_PROFILE_ROW = re.compile(rf"^{_NUM}\s+{_NUM}\s+(?:{_NUM}\s+)?{_NUM}\s+(\S.*)$")  # Median(ms) since 8.4
_SUMMARY_START = re.compile(r"=== Performance summary ===|^Host Latency$|^Trace averages of")


def percentile_key(pct: str) -> str:
    return f"p{float(pct):g}"


def decode_packed_version(digits: str) -> str:
    """`[TensorRT v8601]` -> 8.6.1, `v100300` -> 10.3.0, `v7103` -> 7.1.3."""
    if len(digits) >= 6:
        return f"{int(digits[:-4])}.{int(digits[-4:-2])}.{int(digits[-2:])}"
    return f"{int(digits[0])}.{int(digits[1])}.{int(digits[2:])}"


def messages(text: str) -> list[tuple[str, str]]:
    """(severity, message) per line; '&' for &&&& status lines, '' for untagged lines of a log that has no
    tags at all (numbers pasted without trtexec's prefix)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out: list[tuple[str, str]] = []
    tagged = False
    for line in lines:
        status = _STATUS.search(line)
        if status:
            out.append(("&", f"{status.group(1)}{status.group(2)}"))
            continue
        m = _TAG.search(line)
        if m:
            tagged = True
            out.append((m.group(1), m.group(2).rstrip()))
        else:
            out.append(("", line.strip()))
    return out if tagged else [(sev or "I", msg) for sev, msg in out]


def parse_log(text: str) -> list[PerfResult]:
    """One result per run in the log (a log without `&&&& RUNNING` lines is one run)."""
    runs: list[list[tuple[str, str]]] = [[]]
    version = None
    summarized = False  # the current run has printed its throughput: another one starts a new run
    for sev, msg in messages(text):
        starts = sev == "&" and msg.startswith("RUNNING")
        again = sev == "I" and summarized and _THROUGHPUT.match(msg.strip()) is not None
        if (starts or again) and any(m for _, m in runs[-1]):
            runs.append([])
            summarized = False
        summarized = summarized or (sev == "I" and _THROUGHPUT.match(msg.strip()) is not None)
        runs[-1].append((sev, msg))
    results = [_parse_run(run) for run in runs]
    for r in results:  # a multi-run log prints the version once per run, or once for all
        version = r.tensorrt_version or version
        r.tensorrt_version = r.tensorrt_version or version
    return results


def parse_summary(text: str) -> PerfResult:
    """The run that has a performance summary (the last one, in a log of several), else the last run."""
    results = parse_log(text)
    with_summary = [r for r in results if r.has_summary]
    return (with_summary or results)[-1]


def _stats(rest: str) -> dict[str, float]:
    out = {}
    for m in _ENTRY.finditer(rest):
        key = percentile_key(m.group(2)) if m.group(2) else m.group(1)
        out[key] = float(m.group(3))
    return out


def _parse_run(run: list[tuple[str, str]]) -> PerfResult:
    reader = _RunReader()
    for sev, msg in run:
        reader.read(sev, msg)
    return reader.finish()


@dataclass
class _RunReader:
    """One run read line by line: the result so far and where in trtexec's output the reader is."""
    r: PerfResult = field(default_factory=PerfResult)
    block: str | None = None  # the 7.x/8.0 block a `min:` line belongs to
    in_summary: bool = False
    in_profile: bool = False
    traces: list[tuple[float | None, ...]] = field(default_factory=list)

    def read(self, sev: str, msg: str) -> None:
        r, stripped = self.r, msg.strip()
        if sev != "&" and stripped:
            r.last_line = stripped
        if sev == "&":
            self._status(msg)
            return
        if r.tensorrt_version is None:
            r.tensorrt_version = _version(msg)
        if sev in ("E", "F"):
            if r.error is None and stripped:
                r.error = stripped
            return
        if _SUMMARY_START.search(stripped):
            self.in_summary = True
        if sev == "W":
            self._warning(msg, stripped)
        elif sev in ("I", "") and not self._profile_line(stripped):
            _parse_info(r, stripped, self.traces, self.block)
            self.block = _next_block(stripped, self.block)

    def _status(self, msg: str) -> None:
        """A `&&&&` line: the run's outcome, its command, the version in its `[TensorRT v8601]` tag."""
        r = self.r
        if msg.startswith(("PASSED", "FAILED")):
            r.status = msg.split()[0].lower()
        if "#" in msg and r.command is None:
            r.command = msg.split("#", 1)[1].strip()
        packed = _VERSION_PACKED.search(msg)
        if packed and not r.tensorrt_version:
            r.tensorrt_version = decode_packed_version(packed.group(1))

    def _warning(self, msg: str, stripped: str) -> None:
        """The summary's `* ...` notes about the measurement (continued on indented lines), and throttling."""
        warnings = self.r.warnings
        if self.in_summary and stripped.startswith("*"):
            warnings.append(stripped.lstrip("* ").strip())
        elif self.in_summary and warnings and msg.startswith(" "):
            warnings[-1] += " " + stripped
        elif "throttl" in stripped.lower():
            warnings.append(stripped)

    def _profile_line(self, line: str) -> bool:
        """Whether `line` belongs to a `--dumpProfile` table (its layer rows are kept); the table ends at the first
        line that is none of its."""
        if _PROFILE_START.match(line):
            self.in_profile, self.r.profile = True, []
            return True
        if not self.in_profile:
            return False
        row = _PROFILE_ROW.match(line)
        if row and row.group(5).strip() != "Total":
            total, avg, median, pct, name = row.groups()
            self.r.profile.append(Layer(name=name.strip(), total_ms=float(total), average_ms=float(avg),
                                        median_ms=float(median) if median else None, percent=float(pct)))
            return True
        if row or line.startswith("Time(ms)"):
            return True
        self.in_profile = False
        return False

    def finish(self) -> PerfResult:
        """The result, its layers slowest first; trace averages where the summary blocks are missing."""
        r, traces = self.r, self.traces
        if r.profile is not None:
            r.profile.sort(key=lambda layer: -(layer.average_ms or 0))
        if r.throughput_qps == 0 and (r.latency_ms or r.gpu_compute_ms):
            r.warnings.append("trtexec printed a throughput of 0 qps next to non-zero latencies (TensorRT 7's "
                              "trtexec miscounts queries in some modes): use the latencies")
        if traces and r.latency_ms is None and r.gpu_compute_ms is None:
            n = len(traces)
            gpu, host, e2e, enq = ({"mean": sum(t[i] for t in traces) / n} if traces[0][i] is not None else None
                                   for i in range(4))
            r.gpu_compute_ms, r.latency_ms, r.end_to_end_ms, r.enqueue_ms = gpu, host, e2e, enq
            r.layout = f"trace averages ({n} lines; the summary blocks are missing)"
        return r


def _version(msg: str) -> str | None:
    """The TensorRT version a line names (`TensorRT version: 10.3.0`, 8.0's `8003`, `[TensorRT v8601]`)."""
    if dotted := _VERSION_DOTTED.search(msg):
        v = dotted.group(1)
        return decode_packed_version(v) if "." not in v and len(v) >= 4 else v
    if packed := _VERSION_PACKED.search(msg):
        return decode_packed_version(packed.group(1))
    return None


def _next_block(line: str, block: str | None) -> str | None:
    name = line.lower().rstrip(":")
    if name in MEASURES:
        return MEASURES[name]
    if _BLOCK_STAT.match(line) or _BLOCK_PCT.match(line) or _THROUGHPUT.match(line) or _HOST_WALLTIME.match(line) \
            or _GPU_TOTAL.match(line):
        return block
    return None


def _merge(r: PerfResult, key: str, values: dict[str, float]) -> None:
    if values:
        setattr(r, key, {**(getattr(r, key) or {}), **values})


def _parse_info(r: PerfResult, line: str, traces: list, block: str | None) -> None:
    if m := _THROUGHPUT.match(line):
        r.throughput_qps = float(m.group(1))
    elif m := _HOST_WALLTIME.match(line):
        r.total_host_walltime_s = float(m.group(1))
    elif m := _GPU_TOTAL.match(line):
        r.total_gpu_compute_s = float(m.group(1))
    elif m := _TRACE.match(line):
        traces.append(tuple(None if m.group(i) is None else float(m.group(i)) for i in (2, 3, 4, 5)))
    elif m := _OLD_AVERAGE.search(line):
        r.gpu_compute_ms = {"mean": float(m.group(2)), percentile_key(m.group(4)): float(m.group(5))}
        r.latency_ms = {"mean": float(m.group(3))}
        r.layout = "TensorRT 6 and earlier ('Average over N runs')"
    elif block and (m := _BLOCK_STAT.match(line)):
        _merge(r, block, {m.group(1): float(m.group(2))})
        if m.group(3) is not None and block == "latency_ms":
            _merge(r, "end_to_end_ms", {m.group(1): float(m.group(3))})
        r.layout = r.layout or "TensorRT 7/8.0 blocks"
    elif block and (m := _BLOCK_PCT.match(line)):
        _merge(r, block, {percentile_key(m.group(2)): float(m.group(1))})
        if m.group(3) is not None and block == "latency_ms":
            _merge(r, "end_to_end_ms", {percentile_key(m.group(4)): float(m.group(3))})
    elif (m := _LINE_MEASURE.match(line)) and m.group(1).strip().lower() in MEASURES:
        stats = _stats(m.group(2))
        if stats:
            _merge(r, MEASURES[m.group(1).strip().lower()], stats)
            r.layout = "TensorRT 8.2+ summary lines"
