"""Conceptual diagrams the chapters draw from their own objects, so a picture cannot drift from the code.

Introduced in chapter 0. Each module draws one kind of picture with matplotlib from the objects a
chapter uses (the model's split into stages, the order torch's schedule produces, a layout of
parallelisms), never from hand-typed coordinates:

- :mod:`ppbook.diagrams.stages`: devices as boxes holding their layers, activations forward and
  gradients back, microbatches numbered (chapters 1 and 2).
- :mod:`ppbook.diagrams.parallelism`: data, tensor and pipeline parallelism side by side on one
  model (chapter 0).
- :mod:`ppbook.diagrams.split`: a model's chain of units cut into stages, by hand and by the
  tracer (chapter 4).
- :mod:`ppbook.diagrams.schedule`: a schedule's order per rank, microbatches (and chunks) numbered
  inside the blocks (chapters 3 and 5).
- :mod:`ppbook.diagrams.microbatch_cost`: what a microbatch costs on a GPU, from a recorded run: a
  block's rate against tokens per microbatch, the step against m (chapter 11; chapter 3's short
  version).
"""
