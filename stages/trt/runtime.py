"""Run a built engine with TensorRT on this machine's GPU: whether it can (the engine's own validity verdict), and
its outputs for a feed.

UNVERIFIED: no engine executes on any machine this project is tested on (no GPU). `can_run` is exercised (it
answers "no" here, with TensorRT-RTX's reason); `EngineRunner` is written against TensorRT's Python API
(named I/O tensors, `set_input_shape`, `set_tensor_address`, `execute_async_v3`, as TensorRT 10/11 and
TensorRT-RTX define them) with device buffers from PyTorch's CUDA allocator, and has never run. Both load the
pipeline's `plugins:` into the process first (`trt/plugins.py`): an engine with plugin layers deserializes only once
their creators are registered.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from trtflow.stages.trt import plugins
from trtflow.stages.trt.env import gpus


def diagnostic_names(trt: Any, diagnostics: Any) -> list[str]:
    """The flags set in `Runtime.get_engine_validity`'s diagnostics (TensorRT-RTX)."""
    return [d for d in ("CUDA_ERROR", "INSUFFICIENT_GPU_MEMORY", "MALFORMED_ENGINE", "OLD_CUDA_DRIVER",
                        "OLD_CUDA_RUNTIME", "UNSUPPORTED_CC", "VERSION_MISMATCH")
            if int(diagnostics) & int(getattr(trt.EngineInvalidityDiagnostics, d))]


def can_run(module: str, plan: Path) -> tuple[bool, str]:
    """(True, "") when this machine can execute the engine, else (False, why)."""
    if not gpus():
        return False, "no NVIDIA GPU on this machine (nvidia-smi finds none)"
    trt = importlib.import_module(module)
    plugins.load(plugins.declared(), module)  # an engine with plugin layers deserializes only with their creators
    lines: list[str] = []

    class Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            lines.append(msg)

    runtime = trt.Runtime(Logger())
    if not hasattr(runtime, "get_engine_validity"):  # full TensorRT: deserializing is the test
        ok = runtime.deserialize_cuda_engine(plan.read_bytes()) is not None
        return ok, "" if ok else (lines[-1] if lines else "the engine does not deserialize here")
    state, diagnostics = runtime.get_engine_validity(plan.read_bytes())
    if str(state).endswith(".VALID"):
        return True, ""
    why = ", ".join(diagnostic_names(trt, diagnostics)) or next((ln for ln in reversed(lines) if "CUDA" in ln or "GPU" in ln), "invalid")
    return False, f"{str(state).split('.')[-1]} on this GPU ({why})"


class EngineRunner:
    """One engine, one execution context per optimization profile used; `run(feed, profile)` -> outputs."""

    def __init__(self, module: str, plan: Path) -> None:
        import torch  # its CUDA allocator and streams: no extra CUDA binding to install

        self.torch = torch
        self.trt = trt = importlib.import_module(module)
        plugins.load(plugins.declared(), module)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(plan.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{plan}: TensorRT could not deserialize the engine")
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in self.names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in self.names if n not in self.inputs]
        self.stream = torch.cuda.Stream()
        self.contexts: dict[int, Any] = {}

    def _context(self, profile: int) -> Any:
        if profile not in self.contexts:
            ctx = self.engine.create_execution_context()
            ctx.set_optimization_profile_async(profile, self.stream.cuda_stream)
            self.contexts[profile] = ctx
        return self.contexts[profile]

    def bind(self, feed: dict[str, np.ndarray], profile: int = 0) -> tuple[Any, dict[str, Any], list[Any]]:
        """(context, output device tensors, input device tensors) with every address set for `feed`."""
        torch, trt = self.torch, self.trt
        ctx = self._context(profile)
        keep = []
        for name in self.inputs:
            x = torch.from_numpy(np.ascontiguousarray(feed[name].astype(trt.nptype(self.engine.get_tensor_dtype(name)))))
            dev = x.cuda()
            keep.append(dev)
            if not ctx.set_input_shape(name, tuple(x.shape)):
                raise RuntimeError(f"input '{name}' shape {list(x.shape)} is outside profile {profile}")
            ctx.set_tensor_address(name, dev.data_ptr())
        results = {}
        for name in self.outputs:
            shape = tuple(ctx.get_tensor_shape(name))
            dtype = trt.nptype(self.engine.get_tensor_dtype(name))
            dev = torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name), device="cuda")
            ctx.set_tensor_address(name, dev.data_ptr())
            results[name] = dev
        return ctx, results, keep

    def run(self, feed: dict[str, np.ndarray], profile: int = 0) -> dict[str, np.ndarray]:
        ctx, results, _ = self.bind(feed, profile)
        if not ctx.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError("execute_async_v3 failed")
        self.stream.synchronize()
        return {name: t.cpu().numpy() for name, t in results.items()}

    def time(self, feed: dict[str, np.ndarray], profile: int, warmup_s: float, duration_s: float,
             iterations: int | None, min_iterations: int = 1) -> tuple[list[float], float]:
        """GPU milliseconds per execution (CUDA events around each enqueue, inputs already on the device) after
        `warmup_s` of untimed executions, and the wall seconds of the timed part."""
        import time as _time

        torch = self.torch
        ctx, _, _ = self.bind(feed, profile)
        handle = self.stream.cuda_stream
        end = _time.perf_counter() + warmup_s
        while _time.perf_counter() < end:
            ctx.execute_async_v3(handle)
        self.stream.synchronize()
        pairs = []
        start = _time.perf_counter()
        while (len(pairs) < iterations) if iterations else (_time.perf_counter() - start < duration_s
                                                            or len(pairs) < min_iterations):
            begin, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(self.stream)
            ctx.execute_async_v3(handle)
            done.record(self.stream)
            pairs.append((begin, done))
            if len(pairs) % 64 == 0:
                self.stream.synchronize()
        self.stream.synchronize()
        wall = _time.perf_counter() - start
        return [b.elapsed_time(d) for b, d in pairs], wall
