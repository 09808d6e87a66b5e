"""Issue #69 item 6: the release's Triton warmup on a model of int64 token ids (a torch Embedding of 50 rows, mean
pooled, a Linear head), built by the real TensorRT-RTX builder with two profiles whose opt sequence lengths (3, 16)
no data file has (its sequences are 5 to 7 ids long). The warmup was Triton's `random_data` there: random int64 ids
far outside the vocabulary, fed to the embedding's Gather while Triton loads the model. Now each profile's warmup is
its data made into the opt shape as validate makes its batches (cropped, or padded with `data.pad`), said in one
warning per profile; random release data keeps its ids within the embedding's rows; no data at all is zeros."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.test_release import ANY_CONTRACT, config_of, engines, release_of
from trtflow.artifact import Artifact, Inputs
from trtflow.pipelines.schema import SampleData
from trtflow.stages.ort.runner import model_inputs
from trtflow.stages.ort.samples import SampleSource

pytestmark = pytest.mark.tensorrt

VOCAB = 50
PAD = 1  # the tokenizer's pad id, given as data.pad
PROFILES = {"short": {"ids": {"min": [1, 2], "opt": [2, 3], "max": [8, 8]}},
            "long": {"ids": {"min": [1, 8], "opt": [4, 16], "max": [8, 32]}}}
LENGTHS = [5, 7, 6, 5]  # the data files' sequence lengths: none is an opt length


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Artifact:
    """Embedding(50, 8) -> mean over the sequence -> Linear(8, 3), exported from torch on the CPU with a dynamic
    batch and sequence axis."""
    import torch

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 8)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, ids):
            return self.head(self.embed(ids).mean(dim=1))

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tokens") / "tokens.onnx"
    with torch.no_grad():
        torch.onnx.export(Classifier().eval(), (torch.zeros(1, 5, dtype=torch.int64),), str(path), dynamo=False,
                          opset_version=17, input_names=["ids"], output_names=["scores"],
                          dynamic_axes={"ids": {0: "batch", 1: "sequence"}, "scores": {0: "batch"}})
    return Artifact(path, "onnx", "p", "prepare")


@pytest.fixture(scope="module")
def built(tmp_path_factory, tokens) -> Path:
    """One engine holding both profiles."""
    return engines(tmp_path_factory.mktemp("built"), [tokens], profiles=PROFILES, profile_mode="combined")


def token_files(folder: Path) -> list[Artifact]:
    """One sequence per file ([1, length] int64), ids 2..49: never the pad id, never outside the vocabulary."""
    folder.mkdir()
    rng = np.random.default_rng(7)
    out = []
    for i, n in enumerate(LENGTHS):
        np.save(folder / f"{i}.npy", rng.integers(2, VOCAB, (1, n)).astype(np.int64))
        out.append(Artifact(folder / f"{i}.npy", "npy", f"t{i}"))
    return out


def warmups(out: Path) -> dict[str, tuple[object, np.ndarray | None]]:
    """Per warmup request (named opt-<profile>): the request, and the ids Triton reads from its file (None where
    it is Triton's random data)."""
    config, model_dir = config_of(out), out / "triton" / "native" / "cls"
    found = {}
    for warm in config.model_warmup:
        item = warm.inputs["ids"]
        data = None if item.random_data else \
            np.fromfile(model_dir / "warmup" / item.input_data_file, np.int64).reshape(list(item.dims))
        found[warm.name] = (warm, data)
    return found


def test_warmup_ids_are_the_data_made_into_each_opt_shape_as_validate_makes_them(tmp_path, tokens, built):
    files = token_files(tmp_path / "data")
    data = {"tensors": "*.npy", "pad": {"ids": PAD}}
    report, out = release_of(tmp_path, built, select=ANY_CONTRACT, data=data, more={"tensors": files})
    observed = set(np.concatenate([np.load(f.path).ravel() for f in files]).tolist())
    # validate's batches at each profile's opt shape, from the same files (validate/measure.py: SampleSource.at)
    model = onnx.load(str(tokens.path))
    source = SampleSource(SampleData(**data), Inputs({"tensors": files}), model_inputs(model), "validate", model)
    found = warmups(out)
    assert sorted(found) == ["opt-long", "opt-short"]
    first = np.load(files[0].path)[0]
    for name, shapes in PROFILES.items():
        warm, ids = found[f"opt-{name}"]
        opt = shapes["ids"]["opt"]
        assert ids is not None, f"profile {name}: Triton's random data"
        assert warm.batch_size == opt[0] and list(ids.shape) == opt[1:]  # one row, Triton repeats it to the batch
        assert np.array_equal(ids, source.at({"ids": opt}).sample(0)["ids"][0])  # validate's first row
        assert set(ids.tolist()) <= observed | {PAD} and ids.max() < VOCAB
    assert found["opt-short"][1].tolist() == first[:3].tolist()  # cropped
    assert found["opt-long"][1].tolist() == first.tolist() + [PAD] * 11  # padded with the pad id
    said = [w for w in report["warnings"] if "warmup" in w]
    assert len(said) == 2, said
    short, long = (next(w for w in said if f"profile '{p}'" in w) for p in ("short", "long"))
    assert "'ids' [2, 3] cropped along dim 1 from 5..7 to 3" in short
    assert f"'ids' [4, 16] padded with {PAD} along dim 1 from 5..7 to 16" in long


def test_random_release_data_keeps_ids_within_the_embedding_and_no_data_is_zeros(tmp_path, built):
    """The release's default data (random): ids drawn as validate's random data draws them, within the rows of the
    table they index (or the range data.ranges declares), said once; a data glob that found nothing: zeros, said
    per profile."""
    report, out = release_of(tmp_path, built, select=ANY_CONTRACT)
    found = warmups(out)
    for name, shapes in PROFILES.items():
        ids = found[f"opt-{name}"][1]
        assert ids is not None and list(ids.shape) == shapes["ids"]["opt"][1:]
        assert ids.min() >= 0 and ids.max() < VOCAB
    assert len({ids.max() for _, ids in found.values()} | {ids.min() for _, ids in found.values()}) > 1  # not constant
    said = [w for w in report["warnings"] if "warmup" in w]
    assert said == [f"warmup: the release's data is random: integer input(s) 'ids' within [0, {VOCAB - 1}] (the rows "
                    f"of the table it indexes), never Triton's random data (give data.tensors, or declare "
                    f"data.ranges, for realistic values)"]

    report, out = release_of(tmp_path, built, select=ANY_CONTRACT, data={"random": True, "ranges": {"ids": [3, 9]}})
    assert all(3 <= ids.min() and ids.max() <= 9 for _, ids in warmups(out).values())
    assert [w for w in report["warnings"] if "warmup" in w][0].startswith(
        "warmup: the release's data is random: integer input(s) 'ids' within [3, 9] (data.ranges)")

    report, out = release_of(tmp_path, built, select=ANY_CONTRACT, data={"tensors": "*.npy"}, more={"tensors": []})
    for _, ids in warmups(out).values():
        assert ids is not None and not ids.any()
    said = [w for w in report["warnings"] if "warmup" in w]
    assert len(said) == 2 and all(re.search(r"cannot make 'ids' \[\d+, \d+\] \(no sample of it\): zeros", w)
                                  for w in said), said


@pytest.mark.slow
def test_real_triton_loads_the_model_warmed_with_its_data(tmp_path, tokens, built, triton):
    """The released repository loaded into the real Triton (tests/triton_server.py), its engine served by the
    STAND-IN `tensorrt` backend (tests/triton_backend/model.py: the model's ONNX on ONNX Runtime, no engine runs),
    which refuses a request no profile takes: Triton reads both warmup requests' files and runs them through the
    model before it is ready. (The same repository with Triton's random data for the ids, as the warmup was, fails
    the load at the embedding's Gather, idx=-1420042007188224409 of [-50, 49], and Triton 2.51 then dies of
    SIGSEGV: not something to do to the shared server.)"""
    files = token_files(tmp_path / "data")
    _, out = release_of(tmp_path, built, select=ANY_CONTRACT, data={"tensors": "*.npy", "pad": {"ids": PAD}},
                        more={"tensors": files}, triton={"model_name": "warm_tokens"})
    served = triton.repository / "warm_tokens"
    shutil.copytree(out / "triton" / "native" / "warm_tokens", served)
    config = served / "config.pbtxt"
    config.write_text(config.read_text().replace("kind: KIND_GPU", "kind: KIND_CPU"))  # no GPU here
    assert config.read_text().count("input_data_file") == 2 and "random_data" not in config.read_text()
    shutil.copy(tokens.path, served / "1" / "model.onnx")  # what the stand-in runs, beside the engine
    triton.load("warm_tokens")
    assert triton.ready("warm_tokens")
