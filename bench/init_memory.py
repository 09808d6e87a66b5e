"""What `trtflow init --data` costs in memory and time, on normal data and on images it must refuse (issue #49).

Runs `trtflow init` on PP-OCRv4's detector (batch, H and W dynamic: the images' sizes make its profile), each case
in a fresh process and a fresh folder, and prints per case its exit code, wall time and peak RSS (the largest of
init's process and the processes it waited for, TensorRT's trial build among them: wait4's rusage), with the
ratio against the baseline measured in the same run:
  scenes        the example's 16 scenes (256x256 and so): the baseline, a file written, trial build included
  32000x32000   the scenes and one PNG of 32000x32000 zeros (1 MB that decodes to 1 GB): over MAX_PIXELS
  9000x7000     3 photos up to 9000x7000 (under MAX_PIXELS): a profile whose input takes 22.5 GiB at its max
                (batch 32), over MAX_INPUT_BYTES; ONNX Runtime ran the detector at 7000x9000 before
Each case's first line of output says what init did.

    python bench/init_memory.py [--repeat N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ppocr-det"
MODEL = EXAMPLE / "models" / "ch_PP-OCRv4_det_infer.onnx"
TIMEOUT_S = 1800


@dataclass
class Row:
    case: str
    codes: list[int]
    seconds: list[float]
    peak_kb: int
    said: str


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def zeros_png(path: Path, width: int, height: int) -> None:
    """A valid gray PNG of zeros, compressed row by row (never held whole)."""
    z = zlib.compressobj(9)
    row = b"\0" * (width + 1)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + _chunk(b"IDAT", idat) + _chunk(b"IEND", b""))


def make_cases(tmp: Path) -> dict[str, Path]:
    """Case -> its data folder."""
    scenes = tmp / "scenes"
    shutil.copytree(EXAMPLE / "data", scenes, ignore=shutil.ignore_patterns("*.md"))
    big = tmp / "big"
    shutil.copytree(scenes, big)
    zeros_png(big / "huge.png", 32000, 32000)  # beside the scenes' .jpg: init globs the folder as *.[jp][np]g
    photos = tmp / "photos"
    photos.mkdir()
    for i, (h, w) in enumerate([(600, 800), (7000, 9000), (1200, 1600)]):
        zeros_png(photos / f"p{i}.png", w, h)
    return {"scenes": scenes, "32000x32000": big, "9000x7000": photos}


def run_init(data: Path, where: Path, env: dict[str, str]) -> tuple[int, float, int, str]:
    """Exit code, wall seconds, peak RSS in KB (init and the processes it waited for), its first line."""
    where.mkdir(parents=True)
    out, err = where / "stdout", where / "stderr"
    with open(out, "wb") as o, open(err, "wb") as e:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "trtflow.flows.cli", "init", str(MODEL), "--data", str(data),
                                 "-o", str(where / "pipeline.yaml")], cwd=where, env=env, stdout=o, stderr=e)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = (out.read_text(errors="replace") + err.read_text(errors="replace")).strip()
    return proc.returncode, seconds, usage.ru_maxrss, (text.splitlines() or [""])[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs per case (wall: the median; RSS: the largest)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="trtflow-bench-init-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TRTFLOW_"))}
    env.update(PREFECT_HOME=str(tmp / "prefect-home"), TRTFLOW_STATE_DIR=str(tmp / "state"), COLUMNS="400")
    try:
        rows = []
        for case, data in make_cases(tmp).items():
            runs = [run_init(data, tmp / "runs" / f"{case}-{i}", env) for i in range(args.repeat)]
            rows.append(Row(case, [r[0] for r in runs], [r[1] for r in runs], max(r[2] for r in runs), runs[-1][3]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    base = rows[0]
    table = Table(title=f"trtflow init --data on {MODEL.name} (peak RSS: init and its children; ratio: against "
                        f"'{base.case}')")
    for column in ("case", "exit", "wall s", "x wall", "peak RSS MB", "x RSS"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for row in rows:
        wall = statistics.median(row.seconds)
        table.add_row(row.case, ",".join(map(str, row.codes)), f"{wall:.1f}",
                      f"{wall / statistics.median(base.seconds):.2f}", f"{row.peak_kb / 1024:.0f}",
                      f"{row.peak_kb / base.peak_kb:.2f}")
    console = Console(width=300)
    console.print(table)
    for row in rows:
        console.print(f"{row.case}: {row.said}", markup=False, highlight=False)


if __name__ == "__main__":
    main()
