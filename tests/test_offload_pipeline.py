"""Issue #68, partial offload, through every stage: a detector whose NonZero TensorRT-RTX's parser refuses (no rule
rewrites it, no plugin is declared) runs from `trtflow run` to a release with `prepare: {offload: onnxruntime}`.
Prepare cuts it at the parser's partition; precision keeps the offloaded node in FP32; build builds each TensorRT
piece of every variant; validate and benchmark run the chain; release writes a Triton ensemble of the pieces, and
the real Triton serves it with the answers of the whole shipped model on ONNX Runtime.

No TensorRT engine runs here: in Triton, the TensorRT pieces are served by the stand-in `tensorrt` backend
(tests/triton_backend/model.py) running the piece's ONNX placed beside its real TensorRT-RTX engine, the ONNX
Runtime piece by the stand-in `onnxruntime` backend. What is proved is the pipeline, the repository and the
ensemble's wiring as Triton reads and runs them, not TensorRT's kernels.
"""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.assets import last_report, trtflow
from tests.test_offload_split import detector, needs_trt
from tests.test_offload_triton import INPUTS, _ask, _max_diff, _whole
from trtflow.stages.onnx.records import read_chain

PIPELINE = """
version: 1
name: {name}
model: models/detector.onnx
stages:
  prepare: {{kind: prepare, offload: onnxruntime}}
  fp16: {{kind: precision, to: fp16, data: {{random: true, samples: 4}}, holdout: 2}}
  build:
    kind: build
    profiles: {{one: {{x: {{min: [1, 3, 16, 16], opt: [1, 3, 16, 16], max: [1, 3, 16, 16]}}}}}}
  validate:
    kind: validate
    data: {{random: true, samples: 4}}
    tolerances: {{"*": {{max_abs: 0.01}}}}
  benchmark: {{kind: benchmark, duration: 0.2s}}
  release: {{kind: release, select: {{require: validated, prefer: size}}}}
"""


def _output(workdir: Path, stage: str, name: str) -> Path:
    return Path(trtflow("output", "pipeline.yaml", stage, name, cwd=workdir).stdout.strip())


def _served_release(workdir: Path, triton, name: str) -> tuple[dict, Path, str]:
    """The release's repository for its one target copied into the server's (KIND_GPU -> KIND_CPU), each TensorRT
    piece's ONNX beside its engine for the stand-in; every model loaded. The release report, the shipped chain's file and its candidate."""
    released = last_report(workdir / ".trtflow", "release")
    (target,) = released["targets"]
    chosen = target["chosen"]["name"]
    chain_dir = _output(workdir, "build", "engines") / f"{target['chosen']['variant']}.chain"
    chain = read_chain(chain_dir)
    repo = _output(workdir, "release", "triton") / target["target"]
    pieces = [m for m in target["models"] if m != name]
    assert target["models"][-1] == name and len(pieces) == len(chain.pieces), target["models"]
    for model in target["models"]:  # the one edit a machine without a GPU needs (tests/triton_server.released)
        shutil.copytree(repo / model, triton.repository / model)
        config = triton.repository / model / "config.pbtxt"
        config.write_text(config.read_text().replace("kind: KIND_GPU", "kind: KIND_CPU"))
    for model, piece in zip(pieces, chain.pieces):
        if piece.runtime == "tensorrt":
            version = next(p for p in (triton.repository / model).iterdir() if p.is_dir())
            assert (version / "model.plan").stat().st_size > 0  # the real engine TensorRT-RTX built
            shutil.copyfile(chain.path(piece), version / "model.onnx")
    for model in target["models"]:
        triton.load(model)
    return released, chain_dir / "chain.json", chosen


@pytest.mark.slow
@needs_trt
def test_a_detector_with_nonzero_ships_as_a_triton_ensemble_that_answers_as_the_whole_model(
        workdir, prefect_api, tensorrt_backend, triton):
    name = "detector-offload"
    onnx.save(detector(), str(workdir / "models" / "detector.onnx"))
    (workdir / "pipeline.yaml").write_text(PIPELINE.format(name=name).lstrip())
    done = trtflow("run", "pipeline.yaml", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr

    prepared = last_report(workdir / ".trtflow", "prepare")["offload"]
    assert [(n["name"], n["op_type"]) for n in prepared["nodes"]] == [("select", "NonZero")]
    assert [p["runtime"] for p in prepared["pieces"]] == ["tensorrt", "onnxruntime", "tensorrt"]
    fp16 = last_report(workdir / ".trtflow", "fp16")
    assert fp16["trial_build"]["ok"] and "pieces" in fp16["trial_build"]["runtime"]

    built = last_report(workdir / ".trtflow", "build")["cells"]
    assert sorted(c["name"] for c in built) == [f"{v}.one.native.p{i:02d}" for v in ("fp16", "prepare")
                                                for i in (0, 2)], built
    assert all(c["status"] == "ok" for c in built)
    validated = last_report(workdir / ".trtflow", "validate")
    assert {c["name"] for c in validated["candidates"]} == {"fp16.one.native", "prepare.one.native"}
    for c in validated["candidates"]:
        assert "as its chain of 3 pieces" in c["runtime"], c["runtime"]
    benchmarked = last_report(workdir / ".trtflow", "benchmark")["cells"]
    assert benchmarked and all("its chain's 3 pieces" in m["result"]["runtime"] for m in benchmarked)

    card = (_output(workdir, "release", "card") / "model-card.md").read_text()
    assert "## Where each node runs" in card and "`select`" in card and "NonZero" in card

    released, chain_file, chosen = _served_release(workdir, triton, name)
    shipped = _output(workdir, chosen.split(".")[0], "model")
    assert json.loads(chain_file.read_text())["pieces"][1]["runtime"] == "onnxruntime"
    counts = []
    for what, feeds in INPUTS.items():
        got = _ask(triton, name, read_chain(chain_file.parent), feeds)
        diff = _max_diff(got, _whole(shipped, feeds))
        assert diff <= 1e-6, (what, diff)
        counts.append(len(got["scores"]))
    assert counts[0] != counts[1]  # NonZero's count follows the data through the ensemble
    if chosen.startswith("prepare."):  # the FP32 chain answers as the source model itself
        source = workdir / "models" / "detector.onnx"
        assert _max_diff(_ask(triton, name, read_chain(chain_file.parent), INPUTS["noise"]),
                         _whole(source, INPUTS["noise"])) <= 1e-5


@pytest.mark.slow
@needs_trt
def test_without_offload_prepare_refuses_in_one_line_naming_the_option(workdir, prefect_api, tensorrt_backend):
    onnx.save(detector(), str(workdir / "models" / "detector.onnx"))
    text = PIPELINE.format(name="detector-refused").replace("offload: onnxruntime", "offload: none")
    (workdir / "pipeline.yaml").write_text(text.lstrip())
    done = trtflow("run", "pipeline.yaml", cwd=workdir)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "select (NonZero)" in line and "offload: onnxruntime" in line, line


def test_piece_profiles_bound_a_size_only_the_data_decides(tmp_path):
    """The TensorRT piece after the NonZero gets a profile from 0 up to the element count of what NonZero read (every
    location passing), whatever count the sample inputs happened to give."""
    from trtflow.stages.onnx import offload
    from trtflow.stages.onnx.split import prepared
    from trtflow.stages.trt.records import Profile

    model = prepared(detector())
    offload.mark(model, offload.Offload(nodes=["select"]))
    path = tmp_path / "marked.onnx"
    onnx.save(model, str(path))
    chain = offload.cut(path, tmp_path / "chain")
    assert chain is not None and [p.runtime for p in chain.pieces] == ["tensorrt", "onnxruntime", "tensorrt"]
    shape = [1, 3, 16, 16]
    found = offload.piece_profiles(chain, Profile(name="p", shapes={"x": (shape, shape, shape)}))
    assert sorted(found) == [0, 2]
    lo, opt, hi = found[2].shapes["where"]
    assert (lo, hi) == ([1, 0], [1, 256]) and 0 <= opt[1] <= 256
    assert found[0].shapes == {"x": (shape, shape, shape)}
    assert np.array_equal(found[2].shapes["feat_lc"][0], [256, 8])


def test_precision_and_calibrate_leave_the_offloaded_nodes_in_float():
    """A float node ONNX Runtime runs stays FP32 in the FP16 variant and unquantized in the INT8 one, whatever
    their rules would have done with it."""
    from trtflow.pipelines.params.calibrate import CalibrateStage
    from trtflow.pipelines.params.precision import PrecisionStage
    from trtflow.stages.calibrate.stage import _excluded_nodes
    from trtflow.stages.onnx import fp16, offload
    from trtflow.stages.onnx.split import prepared
    from trtflow.stages.precision.stage import block_list

    model = prepared(detector())
    assert "conv2" not in block_list(model, PrecisionStage(kind="precision", to="fp16"), None)
    offload.mark(model, offload.Offload(nodes=["conv2", "select"]))
    blocked = block_list(model, PrecisionStage(kind="precision", to="fp16"), None)
    assert blocked["conv2"] == offload.WHY
    assert "conv2" in fp16.plan(model, blocked, set()).fp32 and "conv1" not in fp16.plan(model, blocked, set()).fp32
    excluded = _excluded_nodes(model, CalibrateStage(kind="calibrate", data={"random": True}), False, False)
    assert excluded["conv2"] == offload.WHY and "conv1" not in excluded


@pytest.mark.slow
@needs_trt
def test_init_offloads_what_no_rule_rewrites_in_the_file_it_writes(tmp_path, tensorrt_backend):
    """Issue #68 Build 1: `trtflow init` on the detector names the NonZero no rule rewrites and writes
    `offload: onnxruntime` into prepare; the file it writes is one `trtflow validate` takes."""
    onnx.save(detector(), str(tmp_path / "detector.onnx"))
    done = trtflow("init", "detector.onnx", "--task", "other", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    written = (tmp_path / "pipeline.yaml").read_text()
    assert any(line.split("#")[0].strip() == "offload: onnxruntime" for line in written.splitlines()), written
    text = " ".join(line.strip().lstrip("#").strip() for line in written.splitlines())
    assert "no rule rewrites select (NonZero)" in text and "FAILS" not in text, text
    assert trtflow("validate", "pipeline.yaml", cwd=tmp_path).returncode == 0


# --- a real trained model: ddddocr's captcha reader, dynamically quantized, its LSTM offloaded ------------------

DDDDOCR = "ddddocr==1.6.1"  # MIT; `common_old.onnx` is what `ddddocr.DdddOcr()` loads by default
CAPTCHA_PIPELINE = """
version: 1
name: captcha
model: models/captcha.onnx
stages:
  prepare:
    kind: prepare
    offload: onnxruntime
    input_shapes: {input1: [1, 1, 64, 160]}
    check: {data: {tensors: "data/*.npy"}}
  build:
    kind: build
    profiles: {line: {input1: {min: [1, 1, 64, 96], opt: [1, 1, 64, 160], max: [1, 1, 64, 256]}}}
  validate:
    kind: validate
    data: {tensors: "data/*.npy"}
    metrics: {"387": {ctc: {blank: 0, batch_axis: 1}}}   # [T, 1, 8210]: time-major
    tolerances: {"387": {text_exact: 1.0}}
  benchmark: {kind: benchmark, iterations: 5}
  release: {kind: release, select: {require: validated, prefer: size}}
"""


def _captchas(folder: Path) -> dict[str, str]:
    """Captchas as the package reads them (grey, height 64, /255): five letters and digits drawn with OpenCV over two
    stray lines, at the profile's min, opt and max widths. File stem -> the text drawn."""
    import cv2

    rng = np.random.default_rng(0)
    drawn = {}
    for i, width in enumerate((96, 96, 160, 160, 256, 256)):
        text = "".join(rng.choice(list("abcdefghijkmnpqrstuvwxyz23456789"), 4 if width == 96 else 5))
        image = np.full((64, width), 255, np.uint8)
        cv2.putText(image, text, (6, 46), cv2.FONT_HERSHEY_SIMPLEX, 1.3 if width > 96 else 1.0, 0, 3, cv2.LINE_AA)
        for _ in range(2):
            ends = rng.integers(0, [width, 64], size=(2, 2))
            cv2.line(image, tuple(int(v) for v in ends[0]), tuple(int(v) for v in ends[1]), 120, 1)
        np.save(folder / f"{i}.npy", (image.astype(np.float32) / 255)[None, None])
        drawn[str(i)] = text
    return drawn


def _read(scores: np.ndarray, charset: list[str]) -> str:
    from trtflow.metrics.builtin.ctc import ctc_greedy

    (labels,) = ctc_greedy(scores, 0, -1, 1)
    return "".join(charset[i] for i in labels)


@pytest.mark.slow
@needs_trt
def test_a_dynamically_quantized_captcha_reader_ships_with_its_lstm_on_onnx_runtime(
        workdir, prefect_api, tensorrt_backend, triton):
    """Issue #68 Build 5, fixed by offload: ddddocr's trained captcha reader (a CRNN quantized by ONNX Runtime's
    dynamic quantizer) is refused by the parser at 45 nodes. Prepare rewrites the 22 DynamicQuantizeLinear with the
    21 ConvInteger and the MatMulInteger they feed into float ops (exact), offloads the DynamicQuantizeLSTM no rule
    covers, and the release's ensemble (TensorRT: the convolutions; ONNX Runtime: the LSTM; TensorRT: the classifier)
    reads every captcha, at the profile's three widths, as the whole model does."""
    import importlib.util

    from tests.assets import wheel_file

    shutil.copy(wheel_file(DDDDOCR, "ddddocr/common_old.onnx"), workdir / "models" / "captcha.onnx")
    spec = importlib.util.spec_from_file_location("ddddocr_charsets", wheel_file(DDDDOCR, "ddddocr/charsets.py"))
    charsets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(charsets)
    (workdir / "data").mkdir()
    drawn = _captchas(workdir / "data")
    (workdir / "pipeline.yaml").write_text(CAPTCHA_PIPELINE.lstrip())
    done = trtflow("run", "pipeline.yaml", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr

    prepared = last_report(workdir / ".trtflow", "prepare")
    kept = Counter(r["op_type"] for r in prepared["rewrites"] if r["kept"])
    assert kept == {"DynamicQuantizeLinear": 22}, kept  # each takes the ConvInteger/MatMulInteger it feeds along
    assert max(r["max_abs"] for r in prepared["rewrites"] if r["kept"]) == 0.0
    assert [n["op_type"] for n in prepared["offload"]["nodes"]] == ["DynamicQuantizeLSTM"]
    assert [p["runtime"] for p in prepared["offload"]["pieces"]] == ["tensorrt", "onnxruntime", "tensorrt"]
    (checked,) = last_report(workdir / ".trtflow", "validate")["candidates"]
    assert "as its chain of 3 pieces" in checked["runtime"]

    name = "captcha"
    _, chain_file, chosen = _served_release(workdir, triton, name)
    source = workdir / "models" / "captcha.onnx"
    read = {}
    for stem in sorted(drawn):
        feeds = {"input1": np.load(workdir / "data" / f"{stem}.npy")}
        served = _ask(triton, name, read_chain(chain_file.parent), feeds)["387"]
        whole = _whole(source, feeds)["387"]
        assert served.shape == whole.shape and float(np.abs(served - whole).max()) <= 1e-4
        read[stem] = _read(served, charsets.CHARSET_OLD)
        assert read[stem] == _read(whole, charsets.CHARSET_OLD)
    right = sum(read[s] == drawn[s] for s in drawn)
    assert right >= 4, (read, drawn)  # the reader reads the captchas: what it returns is text, not noise
