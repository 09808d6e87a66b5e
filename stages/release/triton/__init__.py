"""Triton Inference Server: the model repository a release writes (config.pbtxt from the engine's IO and profiles,
checked with Triton's own protobuf schema) and the versions released so far."""
