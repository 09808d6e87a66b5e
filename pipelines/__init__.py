"""The pipeline spec: what the user declared (YAML), validated, resolved into a stage graph.

Knows nothing about Prefect or TensorRT.
"""
