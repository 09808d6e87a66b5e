"""Task metrics: accuracy the way a model's users judge an output (top-k, decoded text, regions, embeddings, boxes,
pixels, a regression's errors, a decision at a threshold, or your function).

A built-in metric is one module of `builtin/`, named by the key a pipeline declares it by (`metrics: {y: {topk:
{k: 5}}}`): its declaration (its parameters, every name it gives and how each is read, its default bounds) and its
computation. `builtin/` finds its modules by listing its folder, so adding a built-in metric is adding that module;
the pipeline's schema, validate's bounds, the release's weighing and the docs read it from there. `contract.py` is
what such a module holds, `names.py` how a metric's name is read, `outputs.py` the per-output block of a pipeline
and the computations it declares, `user.py` your own function.
"""
