"""Shared code of the executable book on pipeline parallelism in PyTorch.

Modules, in the order the book introduces them. What needs no torch lives in the subpackage
:mod:`ppbook.planner`, and the chapters import it from there (``from ppbook.planner import
simulate``); no module here shares a name with one of the planner's (``tests/test_package_layers.py``).

* :mod:`ppbook.model_memory` -- training memory of the book's models and how many devices it needs
  (chapter 0), in bytes per stage and schedule (chapter 10), on the planner's formulas
* :mod:`ppbook.models`  -- the GPT-style and Llama-style models, deterministic from a seed (chapter 0)
* :mod:`ppbook.stages`  -- which layers each stage owns, cutting a stage out; stages per rank per schedule (chapter 0)
* :mod:`ppbook.dist`    -- process-group set-up and tear-down, CPU or GPU (chapter 1)
* :mod:`ppbook.launch`  -- running a companion script under torchrun from a cell or a test (chapter 1)
* :mod:`ppbook.cli`     -- the scripts' shared flags, their validation, the ``run`` wrapper, ``--json`` (chapter 1)
* :mod:`ppbook.workload` -- the scripts' toy GPT, batches, loss and one-process reference (chapter 1)
* :mod:`ppbook.driver`  -- driving a torch schedule's ``step`` from any rank (chapter 1)
* :mod:`ppbook.report`  -- tables and human-friendly numbers in chapter outputs (chapter 0)
* :mod:`ppbook.claims`  -- conclusions the build checks: glue a number, assert the sentence (chapter 0)
* :mod:`ppbook.timeline` -- recording every action of every stage, and Gantt charts (chapter 2)
* :mod:`ppbook.measure` -- timed steps on every rank together, and each step's summary (chapter 2)
* :mod:`ppbook.fit`     -- replaying measured steps in the simulator: measured vs predicted (chapters 2, 3, 5)
* :mod:`ppbook.bubble`  -- closed-form bubble fractions and overheads, with their conventions; a simulated
  order's idle time per rank (chapters 3, 5)
* :mod:`ppbook.torch_orders` -- each rank's order as torch's own schedule classes build it (chapter 5)
* :mod:`ppbook.split`   -- balancing policies, per-layer profiling, meta-device stages (chapter 4)
* :mod:`ppbook.explorer` -- the planner page: the planner's JavaScript port, its data and drawing (after chapter 10)
* :mod:`ppbook.activations` -- activation memory held per stage and microbatch over time (chapter 5)
* :mod:`ppbook.data`    -- the shipped corpus, its locally trained tokenizer, batches (chapter 6)
* :mod:`ppbook.training` -- token-mean loss, global-norm clipping, warmup + cosine (chapter 6)
* :mod:`ppbook.precision` -- --dtype bfloat16: float32 master weights, autocast compute (chapter 6)
* :mod:`ppbook.checkpoint` -- distributed checkpoints: save, resume, reshard, export (chapter 7)
* :mod:`ppbook.skip`    -- a model with a skip connection across stages, tied embeddings (chapter 8)
* :mod:`ppbook.nodes`   -- several torchrun "nodes" on one machine; where mesh ranks land (chapter 9)
* :mod:`ppbook.fsdp_probe` -- FSDP2's all-gathers and gathered bytes during a pipeline step (chapter 9)
* :mod:`ppbook.recompute` -- activation checkpointing per block, the bytes a forward keeps (chapter 12)
* :mod:`ppbook.kernels` -- the Llama block with fused kernels, as the planner counts it (chapter 12)
* :mod:`ppbook.combined` -- what chapter 12's scripts share: one model, its one-process reference, a rank's
  stages and schedule, a timed step, the record (chapter 12)
* :mod:`ppbook.planner` -- the torch-free planner: schedules' orders (``schedules``), the data flow
  (``dataflow``, chapter 2) and the simulator (``simulate``, chapters 2, 3, 5), model shapes, GPUs and
  links, memory by sharding (``memory``), traffic, FSDP's all-gathers (``fsdp_window``, chapter 12),
  costs, the search, published runs (chapters 2-12; the site's planner page)
* :mod:`ppbook.plan`    -- the planner's command line, ``python -m ppbook.plan`` (chapter 10)
* :mod:`ppbook.errors`  -- finding the rank that failed in torchrun's output (appendix C)
"""

__version__ = "0.1.0"
