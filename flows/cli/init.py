"""`trtflow init`: write a first, commented pipeline file for a model (and its sample data), from what the model
and the data say; refuse, naming the flag to pass, what they do not say."""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from trtflow.flows.cli.base import Command, out, write_file
from trtflow.pipelines.init import LAYOUTS, TASKS
from trtflow.text import listed

if TYPE_CHECKING:
    from trtflow.pipelines.init.cost import ProfileCost
    from trtflow.pipelines.init.write import ProfileTrial, Proposal

TRIAL_TIMEOUT_S = 300  # init's trial build takes seconds; a model whose build takes longer is left unchecked


class Init(Command):
    name = "init"
    help = "write a first pipeline.yaml for an ONNX model (and sample data): inputs, profiles, task metrics, stages"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("model", help="the ONNX model")
        parser.add_argument("--data", metavar="DIR|GLOB",
                            help="sample images (or .npy/.npz tensors): they size the profile's dynamic dimensions, "
                                 "feed every stage and calibrate an INT8 variant")
        parser.add_argument("--task", choices=TASKS,
                            help="how the outputs are judged, where their shapes do not say (image: outputs that "
                                 "are images, by PSNR, pixels within a level and SSIM; regress: values by their "
                                 "errors in the output's own units; other: by one cosine pooled over every sample)")
        parser.add_argument("--layout", choices=LAYOUTS, help="a detection head's layout, where its shape does not "
                                                              "say")
        parser.add_argument("--shape", dest="shapes", action="append", default=[], metavar="NAME=DIMS",
                            help="an input's profile, dimensions joined by 'x', each N or MIN:OPT:MAX, e.g. "
                                 "x=1:8:32x3x48x320 (repeatable)")
        parser.add_argument("--name", help="the pipeline's name (default: the model file's name)")
        parser.add_argument("-o", "--output", help="where to write it (default: pipeline.yaml beside the model); "
                                                   "never over an existing file")

    def run(self, args: argparse.Namespace) -> int:
        from trtflow.errors import SpecError
        from trtflow.pipelines.init.propose import default_output, propose
        from trtflow.pipelines.init.write import render
        from trtflow.yaml_text import comment_text

        model = Path(args.model)
        target = Path(args.output) if args.output else default_output(model)
        exists = f"give another -o, or remove {target}"
        if target.exists() or target.is_symlink():  # before reading anything: the write below checks again
            raise SpecError(f"{target} exists: init never overwrites a file", hint=exists)
        proposal = propose(model, out=target, command=_command(args), data=args.data, task=args.task,
                           layout=args.layout, shapes=args.shapes, name=args.name)
        proposal = dataclasses.replace(proposal, trial=trial_build(proposal), cost=profile_cost(proposal))
        text = render(proposal)
        validated(text, target)
        write_file(target, text, exists_hint=exists)
        if proposal.trial.passed is False:
            raise fails_to_run(target, proposal.trial)
        tasks = ", ".join(proposal.task.tasks()) or "none (each output judged by one cosine pooled over every sample)"
        said = escape(comment_text(f"wrote {target}: task {tasks}; {proposal.trial.said()}"))  # a model's names
        out.print(f"{said}; check it with `trtflow validate {escape(str(target))}`, run it with `trtflow run "
                  f"{escape(str(target))}`")
        if proposal.cost is not None and (warning := proposal.cost.warning()):
            out.print(f"[yellow]warning:[/] {escape(comment_text(warning))}")
        return 0


def fails_to_run(target: Path, trial: ProfileTrial) -> Exception:
    """A written file whose trial build fails, with no fix of trtflow's proposed (a rewrite, `offload:
    onnxruntime`): exit 1, so that a script checking init's exit code stops here rather than at prepare. Its one
    line names the file and the reason, which says what to do (a model's names in it escaped)."""
    from trtflow.errors import TrtflowError
    from trtflow.yaml_text import comment_text

    return TrtflowError(comment_text(f"wrote {target}, but it does not run: {trial.said()}"))


def validated(text: str, target: Path) -> None:
    """init never writes a file `trtflow validate` refuses: the same checks, on the text it is about to write."""
    from trtflow.errors import SpecError, format_path
    from trtflow.flows import precheck
    from trtflow.pipelines.graph import build_graph
    from trtflow.pipelines.loader import load_text

    try:
        loaded = load_text(text, target.resolve(), environ={})
        precheck.check(loaded, build_graph(loaded))
    except SpecError as exc:
        at = f" at {format_path(exc.path)}" if exc.path else ""
        raise SpecError(f"nothing written: the file init would write fails `trtflow validate`{at}: {exc.message}",
                        file=str(target), hint="the model's names or sizes are beyond what a pipeline file takes: "
                                               "give --shape with the sizes to build for") from None


def _command(args: argparse.Namespace) -> str:
    words = ["trtflow", "init", args.model]
    for flag, value in (("--data", args.data), ("--task", args.task), ("--layout", args.layout),
                        ("--name", args.name), ("-o", args.output)):
        if value is not None:
            words += [flag, value]
    for shape in args.shapes:
        words += ["--shape", shape]
    return shlex.join(words)


def trial_build(p: Proposal) -> ProfileTrial:
    """The pre-flight prepare runs (TensorRT's parser and a trial build), once, at the whole profile (min / opt /
    max). A build that fails where init chose a size (a dynamic H, W or length) is refused naming the shape and
    the --shape to give; any other outcome is said in the file."""
    from trtflow.pipelines.init.write import ProfileTrial
    from trtflow.stages.trt.env import INSTALL_HINT, find_tensorrt

    if find_tensorrt() is None:
        return ProfileTrial(None, None, why=f"no TensorRT flavour is installed ({INSTALL_HINT})")
    with tempfile.TemporaryDirectory(prefix="trtflow-init-") as folder:
        return _trial(p, _sanitized(p.model.path, Path(folder)))


def _sanitized(model: Path, folder: Path) -> Path:
    """The model as prepare hands it to TensorRT, as far as its inputs' dimensions go: PaddlePaddle's '?' for both
    H and W reads as one symbol to TensorRT, so H = W would be required (prepare names each dimension apart)."""
    from trtflow.stages.onnx import graph, model_io

    loaded = model_io.load(model)
    if not graph.sanitize_dims(loaded):
        return model
    model_io.save(loaded, folder / model.name, external=model_io.has_external_data(loaded) or None)
    return folder / model.name


def _trial(p: Proposal, model: Path) -> ProfileTrial:
    from trtflow.errors import SpecError, TransientStageError
    from trtflow.pipelines.init.write import ProfileTrial
    from trtflow.stages.trt.preflight import run_preflight

    low, opt, high = (p.profile.point(i) for i in range(3))
    try:
        report = run_preflight(model, high, TRIAL_TIMEOUT_S, min_shapes=low, opt_shapes=opt)
    except TransientStageError as exc:
        return ProfileTrial(None, None, why=str(exc))
    runtime = (report.runtime or "").removesuffix(" parser") or None
    if not report.ran:
        return ProfileTrial(runtime, None, why=report.reason or "")
    if not report.parsed or report.trial_build is None:
        return _refused(runtime, report.failures)
    trial = report.trial_build
    if trial.ok:
        return ProfileTrial(runtime, True, trial.seconds)
    if trial.needs_gpu:
        return ProfileTrial(runtime, None, why="the build needs a GPU here")
    chosen = p.profile.chosen()
    if not chosen:  # every dimension fixed by the model but the batch: no size of init's to blame
        return ProfileTrial(runtime, False, why=f"{trial.error} ({trial.hint}); the prepare stage will stop on it")
    where, error = _failing_point(model, (low, opt, high)) or (
        "the profile, " + ", ".join(f"{n} {low[n]} / {opt[n]} / {high[n]}" for n in low), trial.error)
    raise SpecError(f"TensorRT's trial build ({runtime}) fails at {where} ({chosen}): {error}",
                    hint=f"give --shape with the sizes the model was trained at: edit the profile proposed, "
                         f"{p.profile.flags()}")


ONNX_RUNTIME_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")  # ops ONNX Runtime's CPU kernels define


def _refused(runtime: str | None, failures: list) -> ProfileTrial:
    """What prepare will do with the nodes the parser rejects: the rule that rewrites each one it covers, and
    offload to ONNX Runtime for those none covers (the file then sets `offload: onnxruntime`); both are checked when
    prepare runs, so the trial is 'not checked'. An op of a domain ONNX Runtime does not define fails the trial:
    only a plugin fixes it."""
    from trtflow.pipelines.init.write import ProfileTrial
    from trtflow.stages.onnx.rewrites import rules_for

    if not failures:
        return ProfileTrial(runtime, False, why="the parser rejects the model; see prepare's report")
    rules = [[r.name for r in rules_for(f.op_type, f.domain)] for f in failures]
    rewritten = [f"{f.node or f.op_type} ({f.op_type}) by {', '.join(names)}" for f, names in zip(failures, rules)
                 if names]
    left = [f for f, names in zip(failures, rules) if not names]
    said = f"the parser rejects {len(failures)} node(s) of the model"
    if rewritten:
        said += f"; prepare rewrites {len(rewritten)} of them (rewrites: auto, checked when it runs): " + \
            listed(rewritten, 3)
    alien = [f for f in left if f.domain not in ONNX_RUNTIME_DOMAINS]
    if alien:  # an op of a domain of its own: ONNX Runtime has no kernel for it either, only a plugin helps
        said += (f"; the prepare stage will stop on {alien[0].node} ({alien[0].op_type}: no rule rewrites it, and "
                 f"ONNX Runtime, which offload would run it on, does not define {alien[0].domain}): {alien[0].hint}")
        return ProfileTrial(runtime, False, why=said)
    if left:
        said += (f"; no rule rewrites {left[0].node} ({left[0].op_type})" + (f" and {len(left) - 1} more" if
                 len(left) > 1 else "") + ": prepare offloads them to ONNX Runtime (offload: onnxruntime), and cuts "
                 "the model where its partition says, checked when it runs")
    return ProfileTrial(runtime, None, why=said, offload=bool(left))


def _failing_point(model: Path, points: tuple[dict, dict, dict]) -> tuple[str, str] | None:
    """The first of min, opt and max that fails alone, built at that one shape, and TensorRT's reason there (a
    concrete one: at a whole profile it reasons in symbols). None where each builds alone."""
    from trtflow.errors import TransientStageError
    from trtflow.stages.trt.preflight import run_preflight

    for label, shapes in zip(("min", "opt", "max"), points):
        try:
            trial = run_preflight(model, shapes, TRIAL_TIMEOUT_S).trial_build
        except TransientStageError:
            return None
        if trial is not None and not trial.ok:
            return f"{', '.join(f'{n} {s}' for n, s in shapes.items())}, the profile's {label}", trial.error or ""
    return None


def profile_cost(p: Proposal) -> ProfileCost | None:
    """What the profile costs on ONNX Runtime (pipelines/init/cost.py): the memory at its max, whole batch and one
    sample, predicted from the graph (stages/ort/memory.py) against the machine's and the budget's; one FP32 pass
    timed at its opt shape (one row of the batch, after one untimed), the stages' run time extrapolated from it.
    None where the graph cannot be copied or inferred; no time where ONNX Runtime does not run the model."""
    import time

    import numpy as np

    from trtflow import procfs
    from trtflow.pipelines.init.cost import ProfileCost, one_row, seconds
    from trtflow.pipelines.init.write import sample_counts
    from trtflow.stages.ort import memory
    from trtflow.stages.ort.runner import random_input, session, whole

    high, rows, timed = p.profile.point(2), one_row(p.profile, 2), one_row(p.profile, 1)
    try:
        graph = memory.Graph.of(p.model.path)
        at_max, one = graph.estimate(high), graph.estimate(rows)
    except Exception:  # noqa: BLE001 - a graph onnx cannot copy or infer: the file says nothing of its cost
        return None
    cost = ProfileCost(at_max.shown(), at_max.peak, one.peak, one.run, at_max.weights, procfs.available(),
                       memory.total(), memory.room().bytes)
    try:
        sess = session(p.model.path)
        rng = np.random.default_rng(0)
        feed = {i.name: random_input(i, timed, rng) for i in sess.get_inputs()}
        whole(sess, feed)  # the first run pays for the arena's allocations: the one timed is the next
        start = time.perf_counter()
        whole(sess, feed)
        took = time.perf_counter() - start
    except Exception:  # noqa: BLE001 - ONNX Runtime's own types, or a type random inputs do not cover
        return cost
    return dataclasses.replace(cost, timed_shape=", ".join(f"{n} {s}" for n, s in timed.items()), pass_s=took,
                               stages_s=seconds(p.profile, sample_counts(p.data), took, len(graph.model.graph.node)))


COMMAND = Init()
