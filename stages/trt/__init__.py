"""TensorRT and TensorRT-RTX: which flavour is installed, parsing, the pre-flight, builder options, the build
worker. Native calls run in child processes (a crash fails one cell, not the pipeline)."""
