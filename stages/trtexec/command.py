"""trtexec's command line for one engine and shape, from the benchmark stage's options, knowing what each
TensorRT version accepts."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtflow.errors import StageError
from trtflow.stages.trtexec.exports import ExportFiles

# options a version's trtexec no longer has, and why
REMOVED = {
    11: {"--fp16": "TensorRT 11 takes precision from the ONNX (the precision/calibrate stages' variants)",
         "--int8": "TensorRT 11 takes precision from the ONNX (Q/DQ from the calibrate stage)",
         "--best": "TensorRT 11 takes precision from the ONNX",
         "--calib": "TensorRT 11 removed implicit calibration"},
}
ON_BY_DEFAULT = {11: ("--useCudaGraph", "--noDataTransfers")}  # flags that only repeat the default there


def major(version: str | None) -> int | None:
    return (release(version) or (None,))[0]


def release(version: str | None) -> tuple[int, int] | None:
    try:
        parts = str(version).split(".")
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def check_args(args: list[str], version: str | None) -> list[str]:
    """Raise for an option the detected trtexec lacks; warnings for options that repeat its defaults."""
    m = major(version)
    warnings = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        for since, removed in REMOVED.items():
            if m is not None and m >= since and flag in removed:
                raise StageError(f"benchmark: trtexec_args {arg}: the detected trtexec (TensorRT {version}) does not "
                                 f"have {flag}: {removed[flag]}")
        for since, flags in ON_BY_DEFAULT.items():
            if m is not None and m >= since and flag in flags:
                warnings.append(f"{flag} is TensorRT {since}'s default already")
    return warnings


def shapes_arg(shapes: dict[str, list[int]]) -> str:
    return ",".join(f"{name}:{'x'.join(str(d) for d in dims)}" for name, dims in shapes.items())


@dataclass(frozen=True)
class Timing:
    """How long trtexec times an engine (seconds), and the user's own arguments, appended last."""
    warmup: float
    duration: float
    iterations: int | None
    min_iterations: int
    trtexec_args: tuple[str, ...] = ()


def compose(trtexec: Path, engine: Path, shapes: dict[str, list[int]], params: Timing, exports: ExportFiles,
            version: str | None, libraries: list[str] = ()) -> list[str]:
    """The command that times `engine`; `libraries`: the plugin libraries it loads first (the pipeline's `plugins:`,
    `--dynamicPlugins` from TensorRT 10 on, `--plugins` before)."""
    cmd = [str(trtexec), f"--loadEngine={engine}", f"--warmUp={int(params.warmup * 1000)}"]
    rel = release(version)
    flag = "--plugins" if rel is not None and rel < (10, 0) else "--dynamicPlugins"
    cmd += [f"{flag}={library}" for library in libraries]
    if rel is not None:  # a list of percentiles from 8.5 on ("Percentiles: 90,95,99" in its logs), one before
        cmd.append("--percentile=90,95,99" if rel >= (8, 5) else "--percentile=99")
    if shapes:
        cmd.append(f"--shapes={shapes_arg(shapes)}")
    if params.iterations:
        cmd += [f"--iterations={params.iterations}", "--duration=0"]
    else:  # trtexec runs at least both: min_iterations holds as on the built-in harness
        cmd += [f"--duration={max(1, round(params.duration))}", f"--iterations={params.min_iterations}"]
    cmd += ["--avgRuns=10", "--separateProfileRun", "--dumpProfile", f"--exportTimes={exports.times}",
            f"--exportProfile={exports.profile}", f"--exportLayerInfo={exports.layers}"]
    return cmd + list(params.trtexec_args)
