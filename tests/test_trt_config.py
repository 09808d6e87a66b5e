"""Each builder option, applied to a real IBuilderConfig of the installed TensorRT flavour on a tiny network, in
this process (as Polygraphy's test_config.py does): the option is read back from the config, and the engine
builds where this machine can build it. TensorRT-RTX here; nothing is mocked except where a test says so."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtflow.errors import StageError
from trtflow.pipelines.schema import BuilderOptions
from trtflow.stages.trt import config, parse
from trtflow.stages.trt.records import Backend

pytestmark = pytest.mark.tensorrt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """Conv + Relu on a 1x3x16x16 input: builds in well under a second on the CPU."""
    w = numpy_helper.from_array(np.random.default_rng(0).random((4, 3, 3, 3), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], [w])
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def session(tiny, tensorrt_backend):
    parsed = parse.parse(tensorrt_backend, tiny)
    assert parsed.ok, parsed.log
    return parsed, parsed.builder.create_builder_config()


def _configure(session, backend, target="native", **options):
    parsed, cfg = session
    opts = BuilderOptions.model_validate(options)
    config.check(opts, parsed.trt, backend, [target])
    return parsed, cfg, config.apply(opts, parsed.trt, cfg, target)


def _builds(parsed, cfg) -> bool:
    return parsed.builder.build_serialized_network(parsed.network, cfg) is not None


def test_no_options_sets_nothing_and_builds(session, tensorrt_backend):
    parsed, cfg, applied = _configure(session, tensorrt_backend)
    assert applied.model_dump() == {}
    assert _builds(parsed, cfg)


def test_optimization_level(session, tensorrt_backend):
    parsed, cfg, applied = _configure(session, tensorrt_backend, optimization_level=0)
    assert cfg.builder_optimization_level == 0 and applied.model_dump() == {"optimization_level": 0}
    assert _builds(parsed, cfg)


def test_workspace_takes_units(session, tensorrt_backend):
    parsed, cfg, applied = _configure(session, tensorrt_backend, workspace="64MiB")
    assert cfg.get_memory_pool_limit(parsed.trt.MemoryPoolType.WORKSPACE) == 64 * 2**20
    assert applied.model_dump() == {"workspace": 64 * 2**20}
    assert _builds(parsed, cfg)


def test_aux_streams(session, tensorrt_backend):
    parsed, cfg, _ = _configure(session, tensorrt_backend, aux_streams=2)
    assert cfg.max_aux_streams == 2
    assert _builds(parsed, cfg)


@pytest.mark.parametrize("level", ["ampere_plus", "same_compute_capability", "none"])
def test_hardware_compatibility(session, tensorrt_backend, level):
    if tensorrt_backend.flavour == "tensorrt-rtx":
        # seen here: TensorRT-RTX has the attribute, logs "setHardwareCompatibilityLevel() is unsupported in
        # TensorRT-RTX" and keeps NONE; trtflow refuses the option instead of letting it do nothing
        parsed, cfg = session
        with pytest.raises(StageError, match="hardware_compatibility is not supported by tensorrt-rtx"):
            _configure(session, tensorrt_backend, hardware_compatibility=level)
        config.apply(BuilderOptions(hardware_compatibility=level), parsed.trt, cfg, "native")
        assert cfg.hardware_compatibility_level == parsed.trt.HardwareCompatibilityLevel.NONE
        return
    parsed, cfg, _ = _configure(session, tensorrt_backend, hardware_compatibility=level)
    assert cfg.hardware_compatibility_level == getattr(parsed.trt.HardwareCompatibilityLevel,
                                                       config.HARDWARE_LEVELS[level])


def test_weight_streaming(session, tensorrt_backend):
    parsed, cfg, _ = _configure(session, tensorrt_backend, weight_streaming=True)
    assert cfg.get_flag(parsed.trt.BuilderFlag.WEIGHT_STREAMING)
    assert _builds(parsed, cfg)


@pytest.mark.parametrize("option,flag", [("version_compatible", "VERSION_COMPATIBLE"), ("strip_plan", "STRIP_PLAN")])
def test_flags_that_need_more_than_this_machine_has(session, tensorrt_backend, option, flag):
    # Set and read back. Seen here, TensorRT-RTX 1.7 without a GPU cannot build either: version_compatible
    # needs libnvinfer_lean.so, strip_plan needs CUDA (tests/test_build_stage.py checks the cell's report).
    parsed, cfg, applied = _configure(session, tensorrt_backend, **{option: True})
    assert cfg.get_flag(getattr(parsed.trt.BuilderFlag, flag)) and applied.model_dump() == {option: True}


def test_compute_capability_target(session, tensorrt_backend):
    if tensorrt_backend.flavour != "tensorrt-rtx":
        pytest.skip("targets are a TensorRT-RTX feature")
    parsed, cfg, applied = _configure(session, tensorrt_backend, target="sm89")
    assert cfg.num_compute_capabilities == 1
    assert cfg.get_compute_capability(0) == parsed.trt.ComputeCapability.SM89
    assert applied.model_dump() == {"compute_capability": "sm89"}
    assert _builds(parsed, cfg)


def test_refused_with_the_reason(session, tensorrt_backend):
    parsed, _ = session
    if tensorrt_backend.flavour == "tensorrt-rtx":
        with pytest.raises(StageError, match=r"legacy_precision \(fp16\) needs TensorRT 10's builder flags"):
            config.check(BuilderOptions(legacy_precision=["fp16"]), parsed.trt, tensorrt_backend, ["native"])
        with pytest.raises(StageError, match=r"unknown target 'sm8'.*known: sm120, sm121, sm75, sm80"):
            config.check(BuilderOptions(), parsed.trt, tensorrt_backend, ["sm8"])
    full = tensorrt_backend.model_copy(update={"flavour": "tensorrt"})  # our rule, not TensorRT's: targets need the RTX flavour
    with pytest.raises(StageError, match=r"targets \['sm89'\]: choosing compute capabilities needs TensorRT-RTX"):
        config.check(BuilderOptions(), parsed.trt, full, ["native", "sm89"])


def test_an_option_the_installed_tensorrt_lacks_is_refused(tensorrt_backend):
    # A stand-in for an older TensorRT without aux streams or weight streaming: this checks trtflow's refusal,
    # not TensorRT (which is why a stand-in is enough here).
    old = SimpleNamespace(IBuilderConfig=SimpleNamespace(), BuilderFlag=SimpleNamespace())
    backend = Backend(flavour="tensorrt", version="8.6.1", module="tensorrt")
    with pytest.raises(StageError, match=r"aux_streams is not available in tensorrt 8.6.1 \(no IBuilderConfig"):
        config.check(BuilderOptions(aux_streams=1), old, backend, ["native"])
    with pytest.raises(StageError, match=r"weight_streaming is not available in tensorrt 8.6.1 \(no BuilderFlag"):
        config.check(BuilderOptions(weight_streaming=True), old, backend, ["native"])


def test_options_survive_the_trip_to_the_worker():
    """The build stage hands the worker JSON; the worker validates it into the same typed object."""
    from trtflow.pipelines.params.build import BuildStage

    stage = BuildStage.model_validate({"kind": "build", "workspace": "1GiB", "optimization_level": 3,
                                       "hardware_compatibility": "ampere_plus"})
    sent = stage.builder_options().model_dump(mode="json")
    assert BuilderOptions.model_validate(sent) == stage.builder_options()
    assert sent["workspace"] == 2**30
    with pytest.raises(ValueError, match="optimization_level"):
        BuilderOptions.model_validate({**sent, "optimization_level": 9})


# TensorRT-RTX 1.7's log entry for the YOLOv8-style head with its grid math in FP16 (tests/test_fp16.py), as captured
MYELIN_ENTRY = "[ERROR] IBuilder::buildSerializedNetwork: Error Code 1: Myelin ([shape.cpp:175: ~op_constraints_msg_streamer_t] \nError during shape inference of\nmul_output_U73 = mul(coordValue_U69, /Range_5_shape_U70_cast_F16), name=/Range_5_shape_U72_mul\nError is:\nInput 0's element type (float) differs from input 1's element type (half).; [shape.cpp:175: ~op_constraints_msg_streamer_t] \nError during shape inference of\nadd_output_U74 : f32[] = add(mul_output_U73, coordValue_U71), name=/Range_5_shape_U72_add\nError is:\nIt is not valid for inputs[0] to have eleme)"

RESHAPE_ENTRY = ("[ERROR] IBuilder::buildSerializedNetwork: Error Code 4: API Usage Error (IShuffleLayer p2o.Reshape.79: "
                 "reshape of empty tensor to non-empty tensor. Reshaping [1,0,120] to [1,1,15,120]. In operator() at "
                 "/_src/optimizer/common/shape/shapeContext.cpp:4633 In analyzeShapes at "
                 "/_src/optimizer/shapeof/graphShapeAnalyzer.cpp:2825)")


def test_a_build_failure_is_one_line_of_whole_words():
    """The worker took TensorRT's last log entry: a Myelin error of about 8 lines, cut mid-word by TensorRT itself
    (`eleme)`). The first error, what it says and the node it names, on one line."""
    from trtflow.stages.trt.log_errors import first_error, shorten

    line = first_error(["[WARNING] something else", MYELIN_ENTRY, "[ERROR] a later error"])
    assert line == ("Myelin: Input 0's element type (float) differs from input 1's element type (half) "
                    "(node /Range_5_shape_U72_mul, shape inference)")
    assert first_error(["[WARNING] only a warning"], "fallback") == "fallback"
    # TensorRT-RTX 1.7 building PP-OCRv4's recognizer at height 22: where in its own source, left out
    assert first_error([RESHAPE_ENTRY]) == ("API Usage Error (IShuffleLayer p2o.Reshape.79: reshape of empty tensor "
                                            "to non-empty tensor. Reshaping [1,0,120] to [1,1,15,120].)")
    long = shorten("word " * 100, 40)
    assert long.endswith(" ...") and len(long) <= 44 and "wor ..." not in long


def test_a_build_record_keeps_its_io_tensors_typed_and_an_older_one_says_build_again():
    """The engine's IO tensors are declared fields of its build record (they travelled as undeclared extras);
    a record from before they were kept reads, and the Triton config asks for the build again."""
    from trtflow.stages.release.triton.config import ConfigError, engine_io
    from trtflow.stages.trt.records import Built

    io = {"inputs": [{"name": "x", "shape": [-1, 3, 48, 192], "dtype": "FLOAT"}],
          "outputs": [{"name": "y", "shape": [-1, 2], "dtype": "FLOAT"}]}
    built = Built.model_validate_json(json.dumps({"status": "ok", "written_by": "a later trtflow", **io}))
    assert built.inputs[0].shape == [-1, 3, 48, 192] and "written_by" not in built.model_dump()
    inputs, outputs = engine_io(SimpleNamespace(built=built, cell=SimpleNamespace(name="e")))
    assert (inputs[0].name, inputs[0].shape, outputs[0].dtype) == ("x", [-1, 3, 48, 192], "FLOAT")
    older = Built.model_validate({"status": "ok"})
    with pytest.raises(ConfigError, match="its build record has no IO tensors .*--force build"):
        engine_io(SimpleNamespace(built=older, cell=SimpleNamespace(name="e")))
