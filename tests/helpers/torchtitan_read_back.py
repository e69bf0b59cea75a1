"""Read exported torchtitan jobs back with torchtitan 0.3.0's own ``ConfigManager``, in a process of
their own (``tests/test_plan_export.py`` runs it).

For each job (a JSON list on stdin of ``{"argv": [...words after "-m torchtitan.train"...]}``) it
loads the registry entry the job names (``--module``, ``--config``) and applies its overrides, as
``torchtitan.train`` does (``ConfigManager().parse_args``: tyro on ``Trainer.Config``, whose own
``__post_init__`` validates the result), then counts the pipeline's stages as torchtitan cuts them
(``_get_pipeline_metadata``). It prints, as a JSON list, each job's fields that the test compares,
or the error torchtitan raised.

torchtitan 0.3.0's registry imports modules the suite does not install (the Makefile installs
torchtitan without its dependencies): ``torchdata`` and ``datasets`` (its data loaders), ``torchao``
(Float8), TensorBoard (``torch.utils.tensorboard`` needs the ``tensorboard`` package) and triton
(its asynchronous expert-parallel kernels). They stand here as empty modules, which is why this runs
in a process of its own: none of them is called to parse a configuration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import importlib.abc
import importlib.machinery
import json
import sys
import types
from types import SimpleNamespace

ABSENT = {"torchdata", "datasets", "torchao"}  # packages, with everything below them
ABSENT_MODULES = {"torchtitan.distributed.minimal_async_ep.kernels", "torch.utils.tensorboard"}


class _Empty(types.ModuleType):
    """A module whose every name is a placeholder class (or, lower-case, a decorator that returns
    what it decorates)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name[0].islower():
            value = lambda *a, **kw: a[0] if len(a) == 1 and callable(a[0]) else (lambda f: f)  # noqa: E731
        else:
            value = type(name, (), {"__init__": lambda self, *a, **kw: None,
                                    "__class_getitem__": classmethod(lambda cls, item: cls)})
        setattr(self, name, value)
        return value


class _Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ABSENT or name in ABSENT_MODULES:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Empty(spec.name)
        module.__version__ = "0.0"
        return module

    def exec_module(self, module):
        module.__path__ = []


def plain(x):
    """A configuration value as JSON (dataclasses as dicts, with their class's name)."""
    if dataclasses.is_dataclass(x):
        return {"_type": type(x).__qualname__, **{f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)
                                                  if f.name != "model_spec"}}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    return x if isinstance(x, (int, float, str, bool)) or x is None else repr(x)


def read_back(argv: list[str]) -> dict:
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            config = ConfigManager().parse_args(argv)
    except (Exception, SystemExit) as e:  # tyro prints what it refuses, and exits
        return {"error": f"{type(e).__name__}: {e}: {' '.join(said.getvalue().split())}"}
    out = plain(config)
    model = config.model_spec.model
    out["model"] = {"layers": len(model.layers), "dim": model.dim, "vocab_size": model.vocab_size}
    par = config.parallelism
    if par.pipeline_parallel_degree > 1:
        stages, _, first, last = _get_pipeline_metadata(SimpleNamespace(pp=par.pipeline_parallel_degree), par, model)
        out["pipeline"] = {"stages": stages, "first_less": first, "last_less": last}
    return out


def main() -> int:
    sys.meta_path.insert(0, _Absent())
    jobs = json.load(sys.stdin)
    json.dump([read_back(job["argv"]) for job in jobs], sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
