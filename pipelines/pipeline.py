"""The pipeline file as a whole: version, name, model, store and the stages of every kind (the JSON Schema too)."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from trtflow.names import ModelName, StageName
from trtflow.pipelines.kinds import KINDS, USER
from trtflow.strict import Strict


def _kind_tag(value: Any) -> str:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in KINDS else USER.name


AnyStage = Annotated[
    Union[tuple(Annotated[k.params, Tag(name)] for name, k in KINDS.items())
          + (Annotated[USER.params, Tag(USER.name)],)],
    Discriminator(_kind_tag),
]


class Plugin(Strict):
    """A TensorRT plugin every stage that parses or builds with TensorRT loads first: a shared library, or a Python
    module of yours that registers its plugin creators when imported."""
    library: str | None = Field(None, description="a shared library of TensorRT plugins, relative to the pipeline "
                                                   "file; its creators are registered by TensorRT's loader, or by "
                                                   "`entry`", examples=["plugins/libmy_plugins.so"])
    entry: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                              description="the library's function taking (logger, namespace) that registers its "
                                          "creators (called with no logger)", examples=["initLibNvInferPlugins"])
    namespace: str = Field("", description="the namespace handed to `entry`")
    python: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
                               description="package.module of yours (beside the pipeline file, or installed) that "
                                           "registers IPluginCreatorV3One creators when imported",
                               examples=["plugins.clip_scale"])

    @model_validator(mode="after")
    def _one_of(self) -> "Plugin":
        if (self.library is None) == (self.python is None):
            raise ValueError("give one of 'library' (a shared library) or 'python' (a module of yours)")
        if self.python is not None and (self.entry is not None or self.namespace):
            raise ValueError("'entry' and 'namespace' go with 'library', not with 'python'")
        return self


class Pipeline(Strict):
    version: Literal[1] = Field(description="spec version; 1 is the only one so far")
    name: ModelName = Field(description="the model's name: the Triton model's, unless a release says otherwise "
                                        "(letters, digits, '_', '-' and '.')", examples=["resnet18-cls"])
    model: str = Field(description="the ONNX model, relative to the pipeline file", examples=["models/model.onnx"])
    artifacts: str | None = Field(None, description="artifact store root (default: .trtflow beside this file)")
    concurrency: int | None = Field(None, ge=1, le=256, description="at most this many stages run side by side "
                                                                   "(default: the CPU count)")
    plugins: list[Plugin] = Field(default_factory=list, max_length=64, description=(
        "TensorRT plugins every stage that parses or builds with TensorRT loads first, in this order, each "
        "`library:` (a shared library, relative to this file; `entry:` its function registering its creators, "
        "`namespace:` handed to it) or `python:` (package.module of yours registering them when imported); their "
        "files are in those stages' keys (docs/guides/unsupported-ops.md#plugins)"),
        examples=[[{"python": "clip_plugin"}, {"library": "plugins/libmy_plugins.so"}]])
    stages: dict[StageName, AnyStage] = Field(min_length=1, description=(
        "the stages by name, in order (an omitted input comes from the nearest earlier stage): each a `kind` and "
        "that kind's keys (the sections below); 'source' and 'shared' are reserved"))

    @field_validator("stages")
    @classmethod
    def _no_reserved(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "source" in v:
            raise ValueError("'source' is reserved: it names the pipeline's model")
        if "shared" in v:
            raise ValueError("'shared' is reserved: the store keeps caches shared by stages under that name")
        return v

    @model_validator(mode="after")
    def _release_names(self) -> "Pipeline":
        """A release's Triton model is named after the pipeline unless it says otherwise (and the name is in the
        release's key like any parameter: renaming the pipeline makes a new release)."""
        for stage in self.stages.values():
            triton = getattr(stage, "triton", None)
            if stage.kind == "release" and triton is not None and triton.model_name is None:
                triton.model_name = self.name
        return self


def json_schema() -> dict[str, Any]:
    schema = Pipeline.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "trtflow pipeline"
    return schema
