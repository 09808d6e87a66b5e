"""The README's promise, as a user would see it: `trtflow run` on the example in fresh processes."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.assets import last_report, trtflow
from tests.browser import open_page
from tests.task_checks import card_shows_composition

ROOT = Path(__file__).resolve().parents[1]


def triton_config(store: Path, released: dict):
    """The released config.pbtxt, read with Triton's own schema (tritonclient's generated model_config_pb2)."""
    from google.protobuf import text_format

    from trtflow.stages.release.triton.config import model_config_pb2
    key = json.loads((store / "release" / "last.json").read_text())["key"]
    repo = store / "release" / key / released["repository"]
    model = repo / released["models"][0]
    assert (model / str(released["version"]) / "model.plan").is_file()
    return text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2().ModelConfig())


def served_by_triton(server, store: Path, tmp: Path, model: str, preprocess: Path | None = None) -> None:
    """The release as a deployment engineer serves it: the real Triton server (2.51.0, CPU) loads the repository
    with one edit (KIND_GPU -> KIND_CPU, no GPU here), a stand-in for the TensorRT backend runs the shipped
    variant's ONNX (tests/triton_backend: proves Triton's side, not TensorRT's), in a Python environment made from
    the release's own requirements. Requests at batch 1, max_batch_size and each profile's min and max agree with
    ONNX Runtime; one over max_batch_size and a dimension outside the profile are refused; the card's request
    example runs. With `preprocess` (a folder of images): the ensemble answers the encoded images with the tensor
    trtflow's own preprocessing makes, and a corrupt image fails only its own request."""
    import numpy as np

    from tests import triton_server as ts
    repo = server.repository
    target, onnx = ts.released(store, repo)
    assert target["models"][0] == model
    for m in target["models"][1:2]:  # the environment is made exactly as the preprocessing model's card says
        assert set(ts.requirements(repo / m)) <= set(server.requirements), (ts.requirements(repo / m), server)
    for m in target["models"]:
        server.load(m)
    contract = json.loads((repo / model / "contract.json").read_text())
    checked = ts.check_engine_model(server, model, onnx[model], contract)
    assert any("refused by the engine" in c for c in checked) or all(
        d != -1 for t in contract["inputs"] for d in t["dims"]), checked
    images = sorted(p for p in (preprocess or tmp).glob("*") if p.suffix in (".png", ".jpg"))
    printed = ts.run_request_example(server, target["request_example"], tmp, *[str(p) for p in images[:1]])
    assert [line.split()[0] for line in printed.splitlines()] == [o["name"] for o in contract["outputs"]] * (
        2 if preprocess else 1), printed
    if preprocess is None:
        return
    import onnxruntime as ort
    import tritonclient.http as http

    from trtflow.stages.image.preprocess import load
    parity = json.loads((store / "parity" / "last.json").read_text())["key"]  # what the release was made from
    pre = load(store / "parity" / parity / "preprocess.json")
    session = ort.InferenceSession(str(onnx[model]), providers=["CPUExecutionProvider"])
    client = server.client()
    bodies = [p.read_bytes() for p in images] + [b"not an image", images[0].read_bytes()[:100]]
    pending = []
    for body in bodies:
        item = http.InferInput("IMAGE", [len(body)], "UINT8")
        item.set_data_from_numpy(np.frombuffer(body, np.uint8))
        pending.append((client.async_infer(f"{model}_preprocess", [item]),
                        client.async_infer(f"{model}_ensemble", [item])))
    for path, (tensor, logits) in zip(images, pending):
        expected = pre(path)
        assert np.array_equal(tensor.get_result().as_numpy(contract["inputs"][0]["name"]), expected), path
        assert np.array_equal(logits.get_result().as_numpy("logits"),
                              session.run(["logits"], {contract["inputs"][0]["name"]: expected})[0]), path
    for tensor, logits in pending[len(images):]:  # each corrupt image fails its own request only
        for answer in (tensor, logits):
            with pytest.raises(Exception, match="cannot decode the image"):
                answer.get_result()


@pytest.fixture
def example(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples" / "ppocr-cls", tmp_path / "ppocr-cls", ignore=shutil.ignore_patterns(".trtflow"))
    shutil.copy(ROOT / "examples" / "trtflow.schema.json", tmp_path / "trtflow.schema.json")
    return tmp_path / "ppocr-cls"


@pytest.mark.slow
def test_example_end_to_end(example: Path, triton):
    first = trtflow("run", "pipeline.yaml", cwd=example)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "7 stages (7 ran, 0 reused)" in first.stdout
    assert "Traceback" not in first.stderr

    store = example / ".trtflow" / "prepare"
    key = json.loads((store / "last.json").read_text())["key"]
    manifest = json.loads((store / key / "manifest.json").read_text())
    report = json.loads((store / key / "report.json").read_text())
    assert manifest["status"] == "ok" and set(manifest["outputs"]) == {"model", "report"}
    assert manifest["key_parts"]["env"]["tensorrt"]["flavour"] in ("tensorrt", "tensorrt-rtx")
    assert report["preflight"]["ran"] is True and report["preflight"]["failures"] == []
    import onnx
    prepared = onnx.load(str(store / key / "model.onnx"))
    assert {o.domain: o.version for o in prepared.opset_import}[""] == 17

    # parity: the declared preprocessing is PaddleOCR's, and the trained classifier reads every line's direction
    checked = last_report(example / ".trtflow", "parity")
    assert checked["verdict"] == "pass" and checked["model"]["top1"] == 1.0
    assert all(p["deploy"] == int(p["image"].endswith("-180.png")) for p in checked["model"]["predictions"])
    r = last_report(example / ".trtflow", "fp16")
    assert r["data"].startswith("images via preprocess")

    second = trtflow("run", "pipeline.yaml", cwd=example)
    assert second.returncode == 0, second.stderr
    assert "7 stages (0 ran, 7 reused)" in second.stdout

    # two mistakes at once, as a deploy pipeline written from memory: one line names both and the fix
    bad = trtflow("run", "pipeline.yaml", "--stage", "parity", "--set", "stages.parity.deploy.0.read=rgb",
                  "--set", "stages.parity.deploy.2.scale=1", cwd=example)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    errors = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "model top-1 agreement 50%" in errors[0], bad.stderr
    assert "likely causes: pixel scale differs (/255), then R and B swapped — fix: scale: 1/255 and read: bgr" \
        in errors[0], bad.stderr

    cells = last_report(example / ".trtflow", "build")
    assert [c["name"] for c in cells["cells"]] == ["prepare.lines.native", "fp16.lines.native"]
    assert all(c["status"] == "ok" for c in cells["cells"])
    measured = last_report(example / ".trtflow", "benchmark")
    assert [c["candidate"] for c in measured["cells"]] == ["fp16.lines.native", "prepare.lines.native"]
    assert all("not a TensorRT number" in c["result"]["runtime"] and c["result"]["throughput_qps"] > 0
               for c in measured["cells"]), "no GPU, no trtexec here: the harness, labelled"
    released = last_report(example / ".trtflow", "release")["targets"][0]
    # issue #51: ground truth (data/labels.csv: each line's true direction): FP32 and every engine scored against it
    validated = last_report(example / ".trtflow", "validate")
    assert validated["labelled"] == {"samples": 8, "values": {"top1": 1.0}, "main": "top1"}, validated["labelled"]
    assert all(c["labelled"]["samples"] == 8 for c in validated["candidates"])
    assert released["chosen"]["labelled"] == next(
        c["labelled"] for c in validated["candidates"] if c["name"] == released["chosen"]["name"])
    release_key = json.loads((example / ".trtflow" / "release" / "last.json").read_text())["key"]
    from trtflow import markdown
    cards = example / ".trtflow" / "release" / release_key / "card"
    card_shows_composition(example / ".trtflow")
    said = (f"Against the labels (8 labelled samples): FP32 top1 100.00%; shipped ({released['chosen']['name']}) "
            f"top1 {released['chosen']['labelled']['values']['top1']:.2%}")
    assert f"**{markdown.text(said)}**" in (cards / "model-card.md").read_text()
    assert f'<p data-field="labelled"><strong>{said}</strong></p>' in (cards / "model-card.html").read_text()
    config = triton_config(example / ".trtflow", released)
    assert config.name == "ppocr-cls" and config.platform == "tensorrt_plan" and config.max_batch_size == 32
    assert [(i.name, list(i.dims)) for i in config.input] == [("x", [3, 48, -1])]  # the profile pins the height
    served_by_triton(triton, example / ".trtflow", example.parent, "ppocr-cls")

    plan = trtflow("plan", "pipeline.yaml", "--set", "stages.prepare.target_opset=16", cwd=example)
    assert plan.returncode == 0, plan.stderr
    assert "params changed: target_opset 17 -> 16" in plan.stdout
    assert "upstream prepare will run" in plan.stdout and "upstream fp16, prepare will run" in plan.stdout


@pytest.fixture
def squeezenet(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples" / "squeezenet-cls", tmp_path / "squeezenet-cls",
                    ignore=shutil.ignore_patterns(".trtflow"))
    shutil.copy(ROOT / "examples" / "trtflow.schema.json", tmp_path / "trtflow.schema.json")
    return tmp_path / "squeezenet-cls"


@pytest.mark.slow
def test_parity_example_and_a_planted_bgr_mistake(squeezenet: Path, triton):
    pytest.importorskip("torchvision")
    bad = trtflow("run", "pipeline.yaml", "--set", "stages.parity.deploy.0.read=bgr", cwd=squeezenet)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    errors = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "likely cause: R and B swapped — fix: read: rgb" in errors[0], bad.stderr
    # (short timings, the same in the three runs below; the gate is off: a regression gate on CPU numbers of a
    # loaded machine is not what this checks)
    quick = ["--set", "stages.benchmark.duration=0.1s", "--set", "stages.benchmark.warmup=0", "--set",
             "stages.benchmark.min_iterations=5", "--set", "stages.benchmark.gate=null"]
    good = trtflow("run", "pipeline.yaml", *quick, cwd=squeezenet)
    assert good.returncode == 0, good.stderr
    assert "8 stages (7 ran, 1 reused)" in good.stdout  # prepare was done by the failed run already
    report = last_report(squeezenet / ".trtflow", "parity")
    assert report["verdict"] == "pass" and report["model"]["top1"] == 1.0
    # the antialiased resize is PIL's, bit for bit: the default tolerances hold with room to spare
    assert report["tolerances"]["max_abs"] == 0.02 and report["tolerances"]["mean_abs"] == 0.005
    assert all(r["max_abs"] < 1e-5 for r in report["images"])
    for variant in ("fp16", "int8"):  # both precision variants were made from the real photos
        r = last_report(squeezenet / ".trtflow", variant)
        assert r["data"].startswith("images via preprocess") and r["accuracy"]["samples"] >= 1
    cells = last_report(squeezenet / ".trtflow", "build")["cells"]
    assert len(cells) == 6 and all(c["status"] == "ok" for c in cells)  # 3 variants x 2 profiles, built in CI
    checked = last_report(squeezenet / ".trtflow", "validate")
    assert checked["passed"] and {c["name"] for c in checked["candidates"]} == {c["name"] for c in cells}
    assert all(c["runtime"].startswith("onnxruntime-cpu") and c["accuracy"]["outputs"]["logits"]["top1"] == 1.0
               for c in checked["candidates"])  # no GPU here: each engine's exact ONNX variant, simulated

    # the release: the engine to deploy among those validate passed, as a Triton repository Triton's schema reads
    store = squeezenet / ".trtflow"
    release = last_report(store, "release")
    target = release["targets"][0]
    assert target["chosen"]["name"] in checked["shipped"] and target["version"] == 1
    # issue #69: the CPU stand-in times FP32 fastest; across precisions the estimate on the GPU class ranks
    assert target["chosen"]["precision"] in ("fp16", "int8"), target["options"]
    assert target["precision_order"].startswith("estimated, not measured: "), target["precision_order"]
    # each variant's nodes left in higher precision, read from its own kind's report (issue #52: no trial parsing)
    counted = {o["variant"]: o["higher_precision_nodes"] for o in target["options"]}
    assert set(counted) == {"prepare", "fp16", "int8"} and counted["prepare"] is None, counted
    assert counted["fp16"] is not None and counted["int8"] is not None, counted
    # issue #54: each engine's compute by precision, as TensorRT builds its variant (strongly typed)
    made = {o["name"]: o["composition"] for o in target["options"]}
    for name, c in made.items():
        main = name.split(".")[0].replace("prepare", "fp32")
        assert c["macs"] > 0.3e9 and c["unsized"] == 0 and c["mac_share"][main] > 0.9, (name, c)
    config = triton_config(store, target)
    assert config.max_batch_size == (32 if ".dynamic." in target["chosen"]["name"] else 1)
    assert [(i.name, list(i.dims)) for i in config.input] == [("input", [3, 224, 224])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [1000])]
    served_by_triton(triton, store, squeezenet.parent, "squeezenet-cls", preprocess=squeezenet / "data")

    # the model card, in a real browser: every picture decoded, every number the one its report holds
    key = json.loads((store / "release" / "last.json").read_text())["key"]
    shot = squeezenet.parent / "model-card.png"
    seen = open_page(store / "release" / key / "card" / "model-card.html", shot)
    print(f"model card screenshot: {shot}")
    assert shot.stat().st_size > 50_000
    assert seen["images"] and all(i["loaded"] and i["width"] > 100 for i in seen["images"]), seen["images"]
    assert seen["fields"]["chosen"] == target["chosen"]["name"] and seen["fields"]["version"] == "1"
    assert seen["fields"]["parity"] == "pass"
    built = {c["name"]: c for c in cells}
    measured = last_report(store, "benchmark")["cells"]
    accuracy = {c["name"]: c["accuracy"]["outputs"] for c in checked["candidates"]}
    compared = 0
    for v in seen["values"]:
        engine, field = v["engine"], v["field"]
        mine = [m for m in measured if m["candidate"] == engine]
        expected = {
            "engine_bytes": built[engine]["engine_bytes"],
            "samples_per_s": max(m["samples_per_s"] for m in mine),
            "p99_ms": min(mine, key=lambda m: m["batch"])["result"]["latency_ms"]["p99"],
            "metric": accuracy[engine].get((v["metric"] or "/").split("/")[0], {}).get((v["metric"] or "/")
                                                                                       .split("/")[1]),
            "accuracy_drop": 1 - accuracy[engine]["logits"]["top1"],  # the metric validate bounds (its tolerance)
            "fp32_mac_share": made[engine]["mac_share"]["fp32"],
        }.get(field)
        if expected is not None:
            assert v["visible"] and v["value"] == pytest.approx(expected, rel=1e-12), (v, expected)
            compared += 1
    assert compared >= 6 * 6, "every engine's size, speed, accuracy and compute by precision was compared"
    for stage in ("prepare", "parity", "fp16", "int8", "build", "validate", "benchmark"):
        assert seen["keys"][stage] == json.loads((store / stage / "last.json").read_text())["key"], stage
    assert "Triton's TensorRT backend loads engines of full TensorRT" in seen["text"]
    assert "Order across precisions: estimated, not measured" in seen["text"]

    # issue #50: the benchmark measured again, twice, nothing else changed, on a machine whose load comes and goes
    # (the suite's other workers beside it, and for the third run a CPU burner too where a core would be idle: the
    # test alone; in the suite the other workers already keep both cores busy, and a burner would only take CPU
    # from them): the same engine ships as the same version each time, never a batch-1 engine under version 1's
    # dynamic-batch contract (that run exited 1). (The second run once measured int8.bs1 at 2.5x the shipped
    # prepare.bs1 beside the other worker: a challenger now needs the median of select.min_runs, 3, runs of both.)
    import os
    import subprocess
    import sys
    for n in range(2):
        idle = os.getloadavg()[0] < (os.cpu_count() or 1) - 0.5
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if n and idle else None
        try:
            again = trtflow("run", "pipeline.yaml", "--force", "benchmark", *quick, cwd=squeezenet)
        finally:
            if burner is not None:
                burner.kill()
                burner.wait()
        assert again.returncode == 0, again.stdout + again.stderr
        shipped = last_report(store, "release")["targets"][0]
        assert (shipped["chosen"]["name"], shipped["version"], shipped["new_version"]) == \
            (target["chosen"]["name"], 1, False), (n, shipped["stability"], shipped["options"])
        runs = {c["candidate"]: c["run_spread"]["runs"] for c in last_report(store, "benchmark")["cells"]}
        assert set(runs.values()) == {n + 2}, runs  # each engine's history on this machine

