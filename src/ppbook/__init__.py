"""Shared code of the executable book on pipeline parallelism in PyTorch.

Modules, in the order the book introduces them:

* :mod:`ppbook.memory`  -- training memory of a model and how many devices it needs (chapter 0)
* :mod:`ppbook.models`  -- the GPT-style and Llama-style models, deterministic from a seed (chapter 0)
* :mod:`ppbook.stages`  -- which layers each stage owns; cutting a stage out of the model (chapter 1)
* :mod:`ppbook.dist`    -- process-group set-up and tear-down, CPU or GPU (chapter 1)
* :mod:`ppbook.launch`  -- running a companion script under torchrun from a cell or a test (chapter 1)
* :mod:`ppbook.skip`    -- a model with a skip connection across stages, tied embeddings (chapter 8)
* :mod:`ppbook.nodes`   -- several torchrun "nodes" on one machine; where mesh ranks land (chapter 9)
"""

__version__ = "0.1.0"
