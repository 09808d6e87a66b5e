"""`trtflow reduce`: cut a failing model down to a small subgraph that still fails (for a bug report)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.markup import escape

from trtflow.flows.cli.base import Command, err, out
from trtflow.stages.bisect import CHECKS


class Reduce(Command):
    name = "reduce"
    help = "cut a failing model down to a small subgraph that still fails (for a bug report)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("model", help="the FP32 ONNX model that fails the check")
        parser.add_argument("--check", required=True, choices=CHECKS,
                            help="fp16/int8: simulated precision differs from FP32 (ONNX Runtime); parse/build: the "
                                 "installed TensorRT rejects it; command: --command exits non-zero")
        parser.add_argument("--qdq", metavar="MODEL", help="int8: a Q/DQ model of MODEL (the calibrate stage's "
                            "variant): its ranges and quantized nodes (default: MinMax of the samples)")
        parser.add_argument("--command", dest="check_command", metavar="CMD",
                            help="command: run on each subgraph; {model} is its path, {inputs} an .npz of its input "
                                 "values")
        parser.add_argument("--data", metavar="FILE", help=".npz of input arrays by name (.npy for one input); a "
                            "leading extra axis holds several samples (default: random)")
        parser.add_argument("--shapes", action="append", default=[], metavar="NAME=1x3x224x224",
                            help="shape of a dynamic input for random data (repeatable)")
        parser.add_argument("--samples", type=int, default=2, help="random samples (default 2)")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--bound", type=float, help="fp16/int8: the cosine an output must reach (default: "
                            "validate's: 0.999 FP16, 0.99 INT8)")
        parser.add_argument("--timeout", type=float, default=600, help="command: seconds per run (default 600)")
        parser.add_argument("-o", "--output", help="where to write the reduced model (default: "
                            "<model>.reduced.onnx in the current directory)")
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def run(self, args: argparse.Namespace) -> int:
        import shutil
        import tempfile

        from trtflow.errors import SpecError
        from trtflow.stages.bisect import reduce as rd
        from trtflow.stages.compare.gate import layer_bound
        from trtflow.stages.onnx import model_io

        model_path = Path(args.model)
        if not model_path.is_file():
            raise SpecError(f"{model_path}: no such file", hint="give the ONNX model that fails")
        if args.check == "command" and not args.check_command:
            raise SpecError("--check command needs --command CMD", hint="e.g. --command 'python repro.py {model}'")
        if args.qdq and args.check != "int8":
            raise SpecError("--qdq is for --check int8")
        shapes = {}
        for item in args.shapes:
            name, _, dims = item.partition("=")
            try:
                shapes[name] = [int(d) for d in dims.lower().split("x")]
            except ValueError:
                raise SpecError(f"--shapes {item!r}: expected NAME=1x3x224x224") from None
        model = model_io.load(model_path)
        output = Path(args.output or f"{model_path.name.removesuffix('.onnx')}.reduced.onnx")
        work = Path(tempfile.mkdtemp(prefix="trtflow-reduce-"))
        status = err.status("reducing ...")
        status.start()
        try:
            feeds = rd.sample_feeds(model, model_path, Path(args.data) if args.data else None, shapes, args.samples,
                                    args.seed)
            check = {"fp16": lambda: rd.fp16_check(args.bound or layer_bound("fp16", {})),
                     "int8": lambda: rd.int8_check(args.bound or layer_bound("int8", {}),
                                                   model_io.load(Path(args.qdq)) if args.qdq else None),
                     "parse": lambda: rd.tensorrt_check(build=False),
                     "build": lambda: rd.tensorrt_check(build=True),
                     "command": lambda: rd.command_check(args.check_command, args.timeout)}[args.check]()
            result = rd.reduce(model, check, feeds, work, progress=lambda m: err.print(f"  {escape(m)}"))
            staged = work / "reduced.onnx"
            model_io.save(result.model, staged, external=False)
            output.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(staged, output)
        finally:
            status.stop()
            shutil.rmtree(work, ignore_errors=True)
        summary = {"model": str(model_path), "check": args.check, "output": str(output),
                   "nodes_before": result.nodes_before, "nodes_after": len(result.nodes), "nodes": result.nodes,
                   "inputs": [i.name for i in result.model.graph.input],
                   "outputs": [o.name for o in result.model.graph.output], "failure": result.failure.message,
                   "checks": result.checks, "seconds": result.seconds, "steps": result.steps}
        if args.json:
            sys.stdout.write(json.dumps(summary, indent=2) + "\n")
            return 0
        out.print(f"[green]reduced[/] {result.nodes_before} -> {len(result.nodes)} nodes in {result.checks} checks "
                  f"({result.seconds:.1f}s): {escape(', '.join(result.nodes[:10]))}"
                  f"{' ...' if len(result.nodes) > 10 else ''}")
        out.print(f"  still fails: {escape(result.failure.message)}")
        out.print(f"  wrote {output}")
        return 0


COMMAND = Reduce()
