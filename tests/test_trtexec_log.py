"""The trtexec parser on real logs published by others: every number checked here is one printed in that file.

The logs were copied from public repositories (each with its source, commit and TensorRT version in
<name>.source.md). Third-party files fetched from repositories are kept outside this repository, in the
workspace's shared folder (`../shared/trtexec/` beside the checkout), not committed here. Where that folder is
absent these tests skip, but in CI (CI=true) they fail naming it: real-data tests never pass by not running."""
from __future__ import annotations

import json

import pytest

from tests.assets import TRTEXEC_DATA as DATA
from tests.assets import require_shared_trtexec
from trtflow.flows import cli
from trtflow.stages.trtexec.log import decode_packed_version, parse_log, parse_summary
from trtflow.stages.trtexec.result import Layer


@pytest.fixture(autouse=True)
def _real_logs() -> None:
    require_shared_trtexec()


# file -> (runs, fields of the summary run: a dotted path into to_json() -> the value printed in the file)
EXPECTED = {
    "trt71_resnet50_int8_caffe_multirun.log": (7, {
        "status": "passed", "tensorrt_version": None, "throughput_qps": 24.7792, "latency_ms.p99": 5173.78,
        "end_to_end_ms.p99": 5173.79, "gpu_compute_ms.p99": 5165.62, "total_host_walltime_s": 15.4969}),
    "trt7223_efficientdet_pad_failed.log": (1, {
        "status": "failed", "has_summary": False, "error": "Failed to parse onnx file"}),
    "trt7223_nvidia_quickstart_resnet50_onnx.log": (1, {
        "status": "passed", "latency_ms.p99": 2.19336, "end_to_end_ms.p99": 4.18213, "gpu_compute_ms.p99": 2.12988,
        "total_host_walltime_s": 3.00755, "throughput_qps": 0.0}),
    "trt803_hackathon_load_fp32_verbose.log": (1, {
        "tensorrt_version": "8.0.3", "status": "passed", "throughput_qps": 6378.46, "latency_ms.min": 0.157104,
        "end_to_end_ms.p99": 0.304688, "h2d_ms.max": 0.0800781, "total_gpu_compute_s": 2.95617}),
    "trt823_hackathon_fp16_failed.log": (1, {"tensorrt_version": "8.2.3", "status": "failed", "has_summary": False,
                                             "error": None}),
    "trt841_efficientnms_plugin_summary_only.log": (1, {
        "tensorrt_version": "8.4.1", "throughput_qps": 233.689, "gpu_compute_ms.mean": 4.26986,
        "total_host_walltime_s": 3.01255}),
    "trt843_yolonas_hash_comment_prefixed.log": (2, {
        "tensorrt_version": "8.4.3", "throughput_qps": 181.088, "gpu_compute_ms.max": 24.0527,
        "total_gpu_compute_s": 3.00524}),
    "trt850_yolov11m_loguru_wrapped.log": (2, {
        "tensorrt_version": "8.5.0", "throughput_qps": 135.689, "gpu_compute_ms.p90": 7.38696,
        "gpu_compute_ms.p95": 7.3988, "total_host_walltime_s": 3.02161}),
    "trt860_hackathon_load_inference_verbose.log": (1, {
        "tensorrt_version": "8.6.0", "status": "passed", "total_gpu_compute_s": 2.84346}),
    "trt861_yolov8s_loadengine_elided.log": (2, {
        "tensorrt_version": "8.6.1", "throughput_qps": 215.68, "gpu_compute_ms.p99": 4.67355,
        "total_host_walltime_s": 3.01372}),
    "trt861_yolov8s_wrong_shape_failed.log": (2, {"status": "failed", "has_summary": False}),
    "codetr-readme-trt10.7.0-summary-fragment.log": (1, {
        "tensorrt_version": "10.7.0", "status": None, "throughput_qps": 32.7494, "enqueue_ms.p95": 0.00585938,
        "gpu_compute_ms.p90": 30.2061, "total_host_walltime_s": 3.08403}),
    "hackathon-trt10.14.1-onnx-default.log": (1, {
        "tensorrt_version": "10.14.1", "throughput_qps": 23188.6, "gpu_compute_ms.max": 0.255997,
        "total_gpu_compute_s": 2.00097}),
    "hackathon-trt10.16.0-plugin-failed.log": (1, {"tensorrt_version": "10.16.0", "status": "failed",
                                                   "has_summary": False}),
    "hackathon-trt10.16.1-dumpprofile.log": (1, {"status": "passed", "has_summary": False}),
    "hackathon-trt10.16.1-loadengine-cudagraph-verbose.log": (1, {
        "tensorrt_version": "10.16.1", "throughput_qps": 24896.9, "gpu_compute_ms.p95": 0.0389404}),
    "hackathon-trt10.16.1-onnx-default.log": (1, {
        "throughput_qps": 15374.3, "enqueue_ms.median": 0.0267334, "total_gpu_compute_s": 1.6586}),
    "hackathon-trt10.16.1-skipinference-dumplayerinfo.log": (1, {"status": "passed", "has_summary": False}),
    "hackathon-trt10.16.1-two-runs-in-python-log.log": (3, {"has_summary": False}),
    "hackathon-trt10.16.1-under-nsys.log": (1, {
        "throughput_qps": 8684.66, "gpu_compute_ms.min": 0.036377, "total_host_walltime_s": 3.00023}),
    "hackathon-trt11.0.0-infstreams-grep-summary.log": (3, {
        "throughput_qps": 33918.6, "gpu_compute_ms.p99": 0.0803223, "total_gpu_compute_s": 7.61806}),
    "hackathon-trt11.0.0-stronglytyped-skipinference-removed-flags.log": (1, {
        "tensorrt_version": "11.0.0", "has_summary": False, "error": "Unknown option: --fp16"}),
    "rist-cctv-readme-trt10.8.0-device-error-fragment.log": (2, {"tensorrt_version": "10.8.0",
                                                                 "has_summary": False}),
    "storeguard-trt10.14.1-docker-build-bench.log": (2, {
        "tensorrt_version": "10.14.1", "throughput_qps": 741.755, "enqueue_ms.p99": 1.53363,
        "gpu_compute_ms.mean": 1.18613, "total_gpu_compute_s": 2.64152}),
}


def field(data: dict, dotted: str):
    for part in dotted.split("."):
        data = None if data is None else data.get(part)
    return data


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_logs(name):
    text = (DATA / name).read_text(errors="replace")
    runs, fields = EXPECTED[name]
    assert len(parse_log(text)) == runs
    result = parse_summary(text).to_json()
    for dotted, expected in fields.items():
        assert field(result, dotted) == expected, (name, dotted)
    assert (DATA / name.replace(".log", ".source.md")).exists(), "every log says where it came from"


def test_every_collected_log_is_tested():
    assert sorted(p.name for p in DATA.glob("*.log")) == sorted(EXPECTED)
    printed = {parse_summary((DATA / n).read_text(errors="replace")).tensorrt_version for n in EXPECTED}
    majors = {v.split(".")[0] for v in printed if v} | {"7"}  # 7.x prints no version; its files say which
    assert majors == {"7", "8", "10", "11"}


def test_the_runs_of_a_log_without_banners_are_told_apart():
    runs = parse_log((DATA / "hackathon-trt11.0.0-infstreams-grep-summary.log").read_text())
    assert [(r.throughput_qps, r.gpu_compute_ms["p99"], r.total_gpu_compute_s) for r in runs] == [
        (16179.7, 0.060791, 2.86708), (29302.3, 0.072998, 5.74258), (33918.6, 0.0803223, 7.61806)]


EXPORTS = {"fuzzylabs-trt10.4.0-alexnet-exportProfile.json", "trex-v0.1.0-trt8.2or8.4-mobilenetv2-exportProfile-nomedian.json",
           "fuzzylabs-trt10.4.0-alexnet-exportTimes.json", "hackathon-trt10.16.1-exportLayerInfo-detailed.json",
           "fuzzylabs-trt10.4.0-alexnet-exportLayerInfo-detailed.json", "hackathon-trt8.6.0-exportLayerInfo-namesonly.json"}


def test_every_collected_export_is_tested():
    assert {p.name for p in DATA.glob("*.json")} == EXPORTS
    for name in EXPORTS:
        assert (DATA / name.replace(".json", ".source.md")).exists(), "every export says where it came from"


def test_exported_json():
    from trtflow.stages.trtexec import exports
    profile = exports.read_profile(DATA / "fuzzylabs-trt10.4.0-alexnet-exportProfile.json")
    assert profile.count == 14590 and len(profile.layers) == 14
    assert profile.layers[0].average_ms == max(layer.average_ms for layer in profile.layers)
    assert profile.layers[0].median_ms is not None
    old = exports.read_profile(DATA / "trex-v0.1.0-trt8.2or8.4-mobilenetv2-exportProfile-nomedian.json")
    assert old.count == 7075 and all(layer.median_ms is None for layer in old.layers)
    assert Layer(name="QuantizeLinear_2", total_ms=83.9859, average_ms=0.0118708, median_ms=None,
                 percent=2.91082) in old.layers
    times = exports.read_times(DATA / "fuzzylabs-trt10.4.0-alexnet-exportTimes.json")
    assert len(times.latency_ms) == 6039 and times.gpu_compute_ms[0] == 0.497559 and times.h2d_ms[0] == 0
    assert len(times.enqueue_ms) == 6039 and times.end_to_end_ms == []  # trtexec 10.4 writes no endToEndMs
    detailed = exports.read_layer_info(DATA / "hackathon-trt10.16.1-exportLayerInfo-detailed.json")
    assert detailed.detailed and detailed.layers[0] == exports.EngineLayer(name="node_conv2d + node_relu",
                                                                           type="CaskConvolution")
    assert detailed.bindings == ["x", "y", "z"]
    alexnet = exports.read_layer_info(DATA / "fuzzylabs-trt10.4.0-alexnet-exportLayerInfo-detailed.json")
    assert alexnet.detailed and len(alexnet.layers) == 14 and alexnet.bindings == ["input", "output"]
    assert alexnet.layers[0] == exports.EngineLayer(
        name="Reformatting CopyNode for Input Tensor 0 to /features/features.0/Conv + /features/features.1/Relu",
        type="Reformat")
    names = exports.read_layer_info(DATA / "hackathon-trt8.6.0-exportLayerInfo-namesonly.json")
    assert not names.detailed and len(names.layers) == 15 and names.bindings == ["tensor-0", "tensor-15"]
    assert all(layer.type is None for layer in names.layers)


def test_the_per_layer_table_of_dump_profile():
    result = parse_summary((DATA / "hackathon-trt10.16.1-dumpprofile.log").read_text())
    assert len(result.profile) == 15 and "Total" not in {layer.name for layer in result.profile}
    assert result.profile[0] == Layer(name="node_conv2d_1_myl3_1", total_ms=209.98, average_ms=0.0114,
                                      median_ms=0.0113, percent=13.7)


def test_a_corrupt_export_is_one_error(tmp_path):
    from trtflow.errors import StageError
    from trtflow.stages.trtexec import exports
    bad = tmp_path / "profile.json"
    bad.write_text((DATA / "fuzzylabs-trt10.4.0-alexnet-exportProfile.json").read_text()[:500])
    with pytest.raises(StageError, match=r"profile.json: not a trtexec --exportProfile JSON \(JSONDecodeError"):
        exports.read_profile(bad)
    # valid JSON of another export's shape: the export it is not, and what it should hold
    layer_info = DATA / "hackathon-trt10.16.1-exportLayerInfo-detailed.json"
    with pytest.raises(StageError, match=r"not a trtexec --exportTimes JSON \(expected a list of per-iteration"):
        exports.read_times(layer_info)
    with pytest.raises(StageError, match=r"not a trtexec --exportLayerInfo JSON \(expected an object with 'Layers'"):
        exports.read_layer_info(DATA / "fuzzylabs-trt10.4.0-alexnet-exportTimes.json")


def test_warnings_are_read_with_their_continuation_lines():
    result = parse_summary((DATA / "trt841_efficientnms_plugin_summary_only.log").read_text())
    assert result.warnings == [
        "Throughput may be bound by Enqueue Time rather than GPU Compute and the GPU may be under-utilized. If not "
        "already in use, --useCudaGraph (utilize CUDA graphs where possible) may increase the throughput.",
        "GPU compute time is unstable, with coefficient of variance = 2.9705%. If not already in use, locking GPU "
        "clock frequency or adding --useSpinWait may improve the stability."]


@pytest.mark.parametrize("name, summary, end_to_end", [
    ("trt7223_nvidia_quickstart_resnet50_onnx.log", "] Host Latency", True),  # 7.x: traces carry end to end
    ("hackathon-trt10.14.1-onnx-default.log", "=== Performance summary ===", False),  # 10.x: enqueue only
])
def test_a_cut_log_falls_back_to_the_trace_averages(name, summary, end_to_end):
    """A real log cut where a killed run would stop: after the per-iteration trace, before the summary."""
    text = (DATA / name).read_text()
    cut = text[:text.index(summary)].rsplit("\n", 1)[0]
    traces = [ln.split("] Average on ", 1)[1] for ln in cut.splitlines() if "] Average on 10 runs - GPU" in ln]
    result = parse_summary(cut)
    assert result.layout.startswith(f"trace averages ({len(traces)} lines") and len(traces) > 100
    assert set(result.gpu_compute_ms) == {"mean"} and result.throughput_qps is None

    def mean(label: str) -> float:
        return sum(float(t.split(label)[1].split(" ms")[0]) for t in traces) / len(traces)
    assert result.gpu_compute_ms["mean"] == pytest.approx(mean("GPU latency: "))
    assert result.latency_ms["mean"] == pytest.approx(mean("Host latency: "))
    assert result.enqueue_ms["mean"] == pytest.approx(mean("enqueue "))
    assert result.end_to_end_ms == ({"mean": pytest.approx(mean("end to end "))} if end_to_end else None)
    assert not parse_summary(text).layout.startswith("trace"), "the whole log has its summary"


def test_a_failure_without_an_error_line_quotes_the_last_line():
    result = parse_summary((DATA / "trt823_hackathon_fp16_failed.log").read_text())
    assert result.no_summary_reason().endswith("its last line was 'Finish parsing network model'")


@pytest.mark.parametrize("name", ["trt850_yolov11m_loguru_wrapped.log", "storeguard-trt10.14.1-docker-build-bench.log"])
def test_windows_line_ends_change_nothing(name):
    text = (DATA / name).read_text()
    crlf = text.replace("\n", "\r\n")
    assert "\r\n" in crlf and parse_summary(crlf).throughput_qps == parse_summary(text).throughput_qps is not None
    assert parse_summary(crlf).to_json() == parse_summary(text).to_json()
    assert [r.to_json() for r in parse_log(crlf)] == [r.to_json() for r in parse_log(text)]


@pytest.mark.parametrize("packed, dotted", [("8601", "8.6.1"), ("100300", "10.3.0"), ("7103", "7.1.3"),
                                            ("8003", "8.0.3"), ("101100", "10.11.0")])
def test_packed_versions(packed, dotted):
    assert decode_packed_version(packed) == dotted


def test_the_command_line(capsys):
    assert cli.main(["parse-trtexec", str(DATA / "trt850_yolov11m_loguru_wrapped.log"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == 2 and data["gpu_compute_ms"]["p99"] == 7.46777
    for key in ("tensorrt_version", "status", "throughput_qps", "latency_ms", "gpu_compute_ms", "enqueue_ms",
                "h2d_ms", "d2h_ms", "end_to_end_ms", "total_host_walltime_s", "total_gpu_compute_s", "warnings",
                "error"):
        assert key in data
    assert cli.main(["parse-trtexec", str(DATA / "trt7223_efficientdet_pad_failed.log")]) == 1
    assert "trtexec says 'Failed to parse onnx file'" in capsys.readouterr().out
