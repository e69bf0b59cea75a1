"""Which layers each pipeline stage owns, and how to cut a stage out of the full model.

Introduced in chapter 1 ("Your first pipeline"); chapter 4 compares other balancing policies.

These are pure functions: they run, and are tested, without any process group.
"""

from __future__ import annotations

import torch.nn as nn


def assign_layers(n_layers: int, num_stages: int) -> list[list[int]]:
    """Split ``range(n_layers)`` into ``num_stages`` contiguous runs whose sizes differ by at most one.

    When the division is uneven the earlier stages get the extra layer, because the last stage
    also carries the norm and the (often large) output head. No layer is ever dropped:
    ``sum(assign_layers(12, 5), [])`` is ``list(range(12))``.

    >>> assign_layers(12, 5)
    [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9], [10, 11]]
    """
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    if n_layers < num_stages:
        raise ValueError(
            f"cannot give {num_stages} stages at least one layer each from {n_layers} layers; "
            f"use at most {n_layers} stages or a model with at least {num_stages} layers"
        )
    base, extra = divmod(n_layers, num_stages)
    out, start = [], 0
    for stage in range(num_stages):
        size = base + (1 if stage < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def stage_module(model: nn.Module, stage_index: int, num_stages: int,
                 layers: list[int] | None = None) -> nn.Module:
    """Turn the full model into stage ``stage_index`` of ``num_stages``, in place, and return it.

    The stage keeps its layers under their original names (``layers.5`` stays ``layers.5``),
    the first stage keeps the embedding, the last keeps the norm and output head; everything
    else is deleted or set to ``None`` so ``forward`` skips it. ``layers`` overrides which
    layers the stage owns (a balanced assignment, chapter 4); by default :func:`assign_layers`.
    """
    if not 0 <= stage_index < num_stages:
        raise ValueError(f"stage_index must be in [0, {num_stages}), got {stage_index}")
    if layers is None:
        layers = assign_layers(len(model.layers), num_stages)[stage_index]
    return keep_parts(model, layers, embedding=stage_index == 0, head=stage_index == num_stages - 1)


def keep_parts(model: nn.Module, layers: list[int], embedding: bool, head: bool) -> nn.Module:
    """Delete, in place, every layer not in ``layers``, and the embedding and the head (norm and
    output) unless asked to keep them; the parts kept keep their names."""
    owned = {str(i) for i in layers}
    missing = owned - set(model.layers.keys())
    if missing:
        raise ValueError(f"layers {sorted(map(int, missing))} are not in the model, which has layers {list(map(int, model.layers.keys()))}")
    for name in list(model.layers.keys()):
        if name not in owned:
            del model.layers[name]
    if not embedding:
        model.tok_embeddings = None
    if not head:
        model.norm = None
        model.output = None
    return model
