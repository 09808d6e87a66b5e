"""Issue #68, partial offload, served: a model cut by the real parser's partition into TensorRT and ONNX Runtime
pieces is written as a Triton model repository (stages/release/triton/chain.py: one model per piece and an
ensemble under the model's name), loaded into the real Triton server (tests/triton_server.py), and asked through
the ensemble with tritonclient: its answers equal the whole model's on ONNX Runtime, for inputs whose NonZero or
Unique makes tensors of different sizes.

No TensorRT engine runs here: the TensorRT pieces are served by the stand-in `tensorrt` backend
(tests/triton_backend/model.py), each with the piece's own ONNX as its "engine" (`model.plan`, and `model.onnx`
beside it, which the stand-in runs on ONNX Runtime); the ONNX Runtime pieces by the stand-in `onnxruntime` backend
(the same file), running the piece's `model.onnx`. What is proved is the repository and its ensemble's wiring as
Triton reads and runs them.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.test_offload_split import detector, needs_trt, vocabulary
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.records import Chain, Piece
from trtflow.stages.onnx.split import prepared, segments, split
from trtflow.stages.release.triton import chain as triton_chain
from trtflow.stages.release.triton.config import ConfigError, model_config_pb2, parse
from trtflow.stages.trt.records import Profile

LARGEST = 256  # what a size the data decides may reach in these models (16 x 16 locations)


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)}


# two inputs whose NonZero and Unique make tensors of different sizes: noise (the detector keeps 208 locations,
# the segmentation head finds 5 classes) and a black image (240 locations, 3 classes)
INPUTS = {"noise": _feeds(1), "black": {"x": np.zeros((1, 3, 16, 16), np.float32)}}


def _whole(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The whole model's outputs on ONNX Runtime's CPU kernels, one intra-op thread as the stand-ins run them."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _profile(piece: Piece) -> Profile:
    """The profile a build would give the piece: its fixed sizes, 1..LARGEST where the data decides."""
    shapes = {}
    for t in piece.inputs:
        lo = [d if isinstance(d, int) else 1 for d in t.shape or []]
        hi = [d if isinstance(d, int) else LARGEST for d in t.shape or []]
        shapes[t.name] = (lo, hi, hi)
    return Profile(name="0", shapes=shapes)


def _engines(chain: Chain) -> dict[int, triton_chain.PieceEngine]:
    """Each TensorRT piece's "engine": its own ONNX (the stand-in backend runs it)."""
    return {i: triton_chain.PieceEngine(chain.path(p), [_profile(p)]) for i, p in enumerate(chain.pieces)
            if p.runtime == "tensorrt"}


def _served(model: onnx.ModelProto, name: str, tmp_path: Path, triton) -> tuple[Path, Chain,
                                                                                triton_chain.ChainRepository]:
    """The model partitioned by the real parser, its chain written into the server's repository and loaded."""
    from trtflow.stages.trt.partition import partition

    path = tmp_path / "model.onnx"
    model_io.save(model, path)
    chain = partition(path, _feeds(1), tmp_path / "offload").chain
    written = triton_chain.write(chain, _engines(chain), triton.repository, name, gpu=False)  # no GPU here
    for index, piece in enumerate(chain.pieces):  # the stand-in runs the ONNX placed beside the "engine"
        if piece.runtime == "tensorrt":
            shutil.copyfile(chain.path(piece), triton.repository / written.pieces[index] / "1" / "model.onnx")
    for model_name in written.models:
        triton.load(model_name)
    return path, chain, written


def _ask(triton, model_name: str, chain: Chain, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from tritonclient import http
    from tritonclient.utils import np_to_triton_dtype

    request = []
    for name, array in feeds.items():
        item = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        request.append(item)
    outputs = [t.name for t in chain.outputs]
    answer = triton.client().infer(model_name, request, outputs=[http.InferRequestedOutput(o) for o in outputs])
    return {o: answer.as_numpy(o) for o in outputs}


def _max_diff(got: dict[str, np.ndarray], whole: dict[str, np.ndarray]) -> float:
    assert got.keys() == whole.keys()
    worst = 0.0
    for name, ref in whole.items():
        assert got[name].dtype == ref.dtype and got[name].shape == ref.shape, (name, got[name].shape, ref.shape)
        if ref.size:
            worst = max(worst, float(np.abs(got[name].astype(np.float64) - ref.astype(np.float64)).max()))
    return worst


def _served_equals_whole(triton, model_name: str, path: Path, chain: Chain) -> list[dict[str, np.ndarray]]:
    answers = []
    for what, feeds in INPUTS.items():
        whole = _whole(path, feeds)
        got = _ask(triton, model_name, chain, feeds)
        diff = _max_diff(got, whole)
        print(f"{model_name} {what}: shapes {({k: v.shape for k, v in got.items()})}, max |diff| {diff:.3g}")
        assert diff <= 1e-6, diff
        answers.append(got)
    return answers


@pytest.mark.slow
@needs_trt
def test_a_detector_cut_around_nonzero_is_served_as_an_ensemble(tmp_path, triton):
    path, chain, written = _served(detector(), "offload_detector", tmp_path, triton)
    assert written.pieces == ["offload_detector_p00_tensorrt", "offload_detector_p01_onnxruntime",
                              "offload_detector_p02_tensorrt"]
    ensemble = parse(written.configs["offload_detector"])
    assert ensemble.platform == "ensemble" and ensemble.max_batch_size == 0
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == written.pieces
    assert [(t.name, list(t.dims)) for t in ensemble.output] == [("boxes", [-1, 4]), ("scores", [-1])]
    first, second = _served_equals_whole(triton, "offload_detector", path, chain)
    assert (len(first["scores"]), len(second["scores"])) == (208, 240)  # NonZero's count follows the data


@pytest.mark.slow
@needs_trt
def test_unique_in_the_middle_with_outputs_from_every_piece_is_served(tmp_path, triton):
    path, chain, written = _served(vocabulary(), "offload_vocabulary", tmp_path, triton)
    assert [p.runtime for p in chain.pieces] == ["tensorrt", "onnxruntime", "tensorrt"]
    ensemble = parse(written.configs["offload_vocabulary"])  # `ids` and `feat`: ensemble outputs read by a step
    assert [t.name for t in ensemble.output] == ["summary", "ids", "feat", "presence"]
    first, second = _served_equals_whole(triton, "offload_vocabulary", path, chain)
    assert (len(first["ids"]), len(second["ids"])) == (5, 3)  # Unique's count follows the data


# --- refused before Triton sees it ---------------------------------------------------------------------------------

def _detector_chain(tmp_path: Path) -> Chain:
    """The detector cut as the parser cuts it (NonZero to ONNX Runtime), without asking the parser."""
    model = prepared(detector())
    runtimes = ["onnxruntime" if n.op_type == "NonZero" else "tensorrt" for n in model.graph.node]
    return split(model, segments(model, runtimes), tmp_path / "cut")


def _unproduced(chain: Chain) -> Chain:
    suffix = chain.pieces[2]
    inputs = [t.model_copy(update={"name": "nowhere"}) if t.name == "where" else t for t in suffix.inputs]
    return chain.model_copy(update={"pieces": [*chain.pieces[:2], suffix.model_copy(update={"inputs": inputs})]})


def _retyped(chain: Chain) -> Chain:
    suffix = chain.pieces[2]
    inputs = [t.model_copy(update={"dtype": "INT32"}) if t.name == "where" else t for t in suffix.inputs]
    return chain.model_copy(update={"pieces": [*chain.pieces[:2], suffix.model_copy(update={"inputs": inputs})]})


def _reshaped(chain: Chain) -> Chain:
    suffix = chain.pieces[2]
    inputs = [t.model_copy(update={"shape": [256, 4]}) if t.name == "feat_lc" else t for t in suffix.inputs]
    return chain.model_copy(update={"pieces": [*chain.pieces[:2], suffix.model_copy(update={"inputs": inputs})]})


@pytest.mark.parametrize("miswire, message", [
    (_unproduced, ("step 2 (offload_bad_p02_tensorrt): input 'nowhere' reads 'nowhere', which is neither an "
                   "ensemble input nor an earlier step's output")),
    (_retyped, ("step 2 (offload_bad_p02_tensorrt) input 'where' reads step 1's output 'where': TYPE_INT64 made, "
                "TYPE_INT32 read")),
    (_reshaped, "input 'feat_lc' reads step 0's output 'feat_lc': dims [256, 8] made, [256, 4] read"),
])
def test_a_miswired_chain_is_refused_with_one_line_before_triton_sees_it(tmp_path, miswire, message):
    chain = miswire(_detector_chain(tmp_path))
    repo = tmp_path / "models"
    repo.mkdir()
    with pytest.raises(ConfigError) as refused:
        triton_chain.write(chain, _engines(chain), repo, "offload_bad")
    assert message in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert not list(repo.iterdir())  # nothing written


def test_the_wiring_check_reads_the_configs_as_triton_does(tmp_path):
    """A step moved before the one producing its input is refused; the configs of a good chain pass."""
    chain = _detector_chain(tmp_path)
    configs = triton_chain.make(chain, "offload_ok")
    assert triton_chain.problems(configs) == []
    ensemble = configs[-1]
    steps = list(ensemble.ensemble_scheduling.step)
    del ensemble.ensemble_scheduling.step[:]
    ensemble.ensemble_scheduling.step.extend([steps[1], steps[0], steps[2]])
    assert any("step 0 (offload_ok_p01_onnxruntime): input 'keep' reads 'keep', which is neither" in p
               for p in triton_chain.problems(configs))
    assert isinstance(ensemble, model_config_pb2().ModelConfig)


def test_names_from_a_model_never_become_paths(tmp_path):
    chain = _detector_chain(tmp_path)
    with pytest.raises(ConfigError, match="the offloaded model's Triton name: '../evil' is not a name"):
        triton_chain.write(chain, _engines(chain), tmp_path / "models", "../evil")
