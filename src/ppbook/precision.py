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

# The largest absolute difference a script's --check accepts between its pipeline and its
# one-process reference, on losses, gradients and updated weights (all of order one here).
# - Where the pipeline and the reference do the same operations on the same shapes in the same
#   order (the references sum the microbatches' gradients, then divide by m, as torch's
#   schedules do), they agree to the bit on a CPU, and the tests hold chapters 1, 3 and 14 and
#   appendix A to 0. The tolerance is for what is not the same arithmetic: a layout that sums in
#   another order than one process (data, expert and tensor parallelism reduce over ranks), and
#   a GPU library that picks another kernel for a microbatch than for the whole batch.
# - float32: 1e-5 is about 80 units in the last place of a value of order one (2^-23 = 1.2e-7):
#   a sum of n terms taken in another order differs by at most (n - 1) units of its terms'
#   magnitude (Higham, Accuracy and Stability of Numerical Algorithms, section 4.2), with n the
#   few ranks or microbatches reduced over, amplified by a few optimizer steps. A reference that
#   rounds differently at every microbatch (scale-then-sum under AdamW, chapter 1's exercise)
#   can exceed it, which is why the references do the schedules' arithmetic.
# - float64: the same 80 units of 2^-52 would be 2e-14; 1e-10 is looser on purpose. A float64
#   run is how the book shows that a float32 difference is rounding (it falls by about the ratio
#   of the two precisions, 2^29), while a mistake (a gradient counted twice, a stage a step
#   behind) leaves differences of the order of the update itself, 1e-4 and more, in either.
# - bfloat16 (autocast, float32 master weights): the matrix products round to 2^-8 = 0.4%; a
#   few of those units on the loss, gradient norms and weights: 2e-2.
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
