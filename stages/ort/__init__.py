"""ONNX Runtime on the CPU: sessions and feeds, model-vs-model checks, tensor ranges, sample data for a model."""
