"""Mixed precision for the companion scripts: ``--dtype bfloat16`` computes under autocast while
the parameters, their gradients and the optimizer state stay float32 (the "master weights").

Introduced in chapter 6 ("A real training loop"). A stage's forward runs inside ``schedule.step``,
so the autocast region wraps the whole step: the matrix products run in bfloat16, while
autocast keeps reductions such as the loss's softmax in float32. The residual stream of the
book's models stays float32 (a float32 input plus a bfloat16 branch is float32), so the
activations passed between stages are float32 as well.

float16 is not offered: it needs a gradient scaler whose "skip this step" decision all stages
must share (an all-reduce of every stage's inf/NaN flag), which the scripts do not implement.
"""

from __future__ import annotations

import contextlib

import torch

AUTOCAST = {"bfloat16": torch.bfloat16}
PARAM_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.float32}

# Pipeline and one-process run do the same operations on the same shapes in the same order, so
# under bfloat16 they agree far better than bfloat16's own resolution; what can differ is which
# kernel a library picks for a microbatch (its blocking, hence its rounding). A few rounding
# units of bfloat16 (2^-8 = 0.4% relative) on the loss, gradient norms and weights bound that.
TOLERANCES = {"float32": 1e-5, "float64": 1e-10, "bfloat16": 2e-2}


def dtype_choices(mixed: bool) -> list[str]:
    """The values of ``--dtype``: float32 and float64, and bfloat16 where the script supports mixed precision."""
    return sorted(PARAM_DTYPES) if mixed else sorted(k for k in PARAM_DTYPES if k not in AUTOCAST)


def param_dtype(name: str) -> torch.dtype:
    """The dtype of the parameters, gradients and optimizer state: float32 under mixed precision."""
    return PARAM_DTYPES[name]


def autocast(device: torch.device, name: str, cache: bool = True):
    """The region in which forward passes compute in ``name`` (no-op for float32/float64).

    Autocast caches the bfloat16 copy of each weight until the outermost region exits, so a region
    must not span an optimizer step: enter it once per step, or pass ``cache=False`` for a region
    around several steps (``workload.adamw_reference_losses``), else later steps compute with the
    weights of the first."""
    if name not in AUTOCAST:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=AUTOCAST[name], cache_enabled=cache)


def tolerance(name: str) -> float:
    """Largest difference accepted between a pipeline and its one-process reference."""
    return TOLERANCES[name]
