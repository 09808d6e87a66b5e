"""ONNX graphs: loading and saving (external data included), what a model is, rewriting it (FP16 emulation)."""
