"""The shared package is layered: an explicit order of modules, no module imports one above it
or one of its own layer, and so no import cycles. Imports are read with ``ast`` (lazy imports
inside functions count too); nothing is imported or run."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "ppbook"

# Bottom to top, along the data flow. A module may import only modules of lower layers.
LAYERS: list[tuple[str, list[str]]] = [
    ("the torch-free planner (a subpackage: its schedules, simulator, memory, search), which imports nothing "
     "of ppbook outside itself", ["planner"]),
    ("gloo held to NCCL's rules, which processes and launching install and which imports nothing of ppbook",
     ["nccl_rules"]),
    ("leaves: formulas, reports, claims, errors, data, processes, launching, the action graph, precision, "
     "recomputation",
     ["report", "claims", "errors", "bubble", "data", "dist", "launch",
      "activations", "checkpoint", "precision", "fsdp_probe", "recompute"]),
    ("the timeline format, recorded and simulated", ["timeline"]),
    ("models, stage placement, driving a schedule, training pieces, packed rows, nodes",
     ["models", "stages", "driver", "training", "packing", "nodes"]),
    ("built on a model or a timeline: balancing, skip models, Hugging Face models, the workload, timing, "
     "torch's own orders, orders torch does not ship, the mixture-of-experts model, the chapters' conceptual "
     "diagrams",
     ["split", "skip", "hf", "workload", "measure", "torch_orders", "custom_schedules", "kernels", "moe",
      "diagrams"]),
    ("on the simulator or the workload: the scripts' command line, fitting the simulator to measured runs, "
     "the planner page, the book's models' memory in bytes per schedule, the simulator taught the all-to-all "
     "and overlapped pairs, chapter 5's schedule guide",
     ["cli", "fit", "explorer", "model_memory", "overlap", "guide"]),
    ("on the scripts' command line: chapter 12's pipeline combined with another tool, run and checked against "
     "one process", ["combined"]),
    ("top: the planner", ["plan"]),
]


def ppbook_imports(source: str) -> set[str]:
    """The ``ppbook`` modules a source imports, anywhere in it (top level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "ppbook":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("ppbook."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("ppbook.")}
    return found


def package_graph() -> dict[str, set[str]]:
    """Each module's ``ppbook`` imports; a subpackage counts as one module, importing what any
    of its files imports from outside it."""
    graph = {path.stem: ppbook_imports(path.read_text()) - {path.stem}
             for path in sorted(PACKAGE.glob("*.py")) if path.stem != "__init__"}
    for folder in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        graph[folder.name] = set().union(*(ppbook_imports(f.read_text()) for f in folder.glob("*.py"))) - {folder.name}
    return graph


def layer_violations(graph: dict[str, set[str]], layers: list[tuple[str, list[str]]]) -> list[str]:
    """One line per module missing from the order and per import of a module not below the importer."""
    level = {mod: i for i, (_, mods) in enumerate(layers) for mod in mods}
    problems = [f"{mod} is in no layer: add it to LAYERS" for mod in sorted(set(graph) - set(level))]
    problems += [f"{mod} (layer {level[mod]}) imports {dep} (layer {level[dep]}), which is not below it"
                 for mod, deps in sorted(graph.items()) if mod in level
                 for dep in sorted(deps) if dep in level and level[dep] >= level[mod]]
    return problems


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk, as the list of modules along it."""
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    return cycles


def test_every_module_is_in_exactly_one_layer():
    names = [mod for _, mods in LAYERS for mod in mods]
    assert len(names) == len(set(names)), "a module is listed in two layers"
    assert set(names) == set(package_graph()), "LAYERS and src/ppbook disagree"


def test_no_module_imports_one_of_its_layer_or_above():
    assert layer_violations(package_graph(), LAYERS) == []


def test_no_import_cycles():
    assert import_cycles(package_graph()) == []


def test_the_checks_catch_an_upward_import_a_cycle_and_a_missing_module():
    # a synthetic package: "low" imports "high" (upward), "high" imports "low" (a cycle), "new" is unplaced
    graph = {"low": ppbook_imports("def f():\n    from ppbook.high import x\n"),
             "high": ppbook_imports("from ppbook import low\n"), "new": set()}
    layers = [("bottom", ["low"]), ("top", ["high"])]
    assert layer_violations(graph, layers) == ["new is in no layer: add it to LAYERS",
                                               "low (layer 0) imports high (layer 1), which is not below it"]
    assert import_cycles(graph) == [["high", "low", "high"]]


def reachable(graph: dict[str, set[str]], mod: str) -> set[str]:
    """Every module ``mod`` imports, directly or through others."""
    seen, todo = set(), [mod]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def module_graph() -> dict[str, set[str]]:
    """Each file's ``ppbook`` imports, with the planner's modules apart (``planner.simulate``): what
    :func:`package_graph` counts as one module ``planner``, for questions about one of its modules."""
    def name(path: Path) -> str:
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for mod, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    (node.module + ".").startswith("ppbook."):
                base = node.module.removeprefix("ppbook").lstrip(".")
                for alias in node.names:
                    whole = f"{base}.{alias.name}".lstrip(".")
                    deps.add(whole if whole in modules else base)
            elif isinstance(node, ast.Import):
                deps |= {alias.name.removeprefix("ppbook.") for alias in node.names if alias.name.startswith("ppbook.")}
        graph[mod] = deps - {mod, ""}
    return graph


def test_the_scripts_plumbing_does_not_pull_in_the_simulator():
    # issue 16: a script reaches the simulator only if it imports ppbook.planner.simulate (or a module
    # built on it: ppbook.fit, ppbook.bubble) itself
    graph = module_graph()
    plumbing = ["cli", "workload", "driver", "measure", "dist", "stages", "timeline"]
    assert {mod: "planner.simulate" in reachable(graph, mod) for mod in plumbing} == dict.fromkeys(plumbing, False)
    assert "planner.simulate" in reachable(graph, "fit")  # the check can see it where it is


def test_no_module_shares_its_name_with_one_of_the_planner():
    """Which ``memory.py`` to change is never a question (issue 53): the torch-free modules live in
    ``ppbook.planner`` and the chapters import them from there; what needs torch beside them has a
    name of its own (``model_memory``, ``torch_orders``). ``diagrams/`` names what a figure draws."""
    outside = {path.stem for path in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    planner = {path.stem for path in (PACKAGE / "planner").glob("*.py")} - {"__init__"}
    assert sorted(outside & planner) == []


PLUMBING = ("ppbook_tools", "tools")  # the build's and the tests' packages beside the teaching package


def plumbing_imports(source: str) -> list[str]:
    """Every import of the plumbing anywhere in ``source``: at module level, inside any function or
    class body (a lazy import is still an import), and through ``importlib.import_module`` or
    ``__import__`` of a literal name; as ``line: module``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if func in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found += [f"{node.lineno}: {name}" for name in names if name.split(".")[0] in PLUMBING]
    return found


def test_the_teaching_package_never_imports_the_plumbing():
    """The launch server plugs itself into ``ppbook.launch`` (``use_forker``); no module of the
    teaching package imports ``ppbook_tools`` or ``tools``, lazily or not (issue 53)."""
    found = {path.relative_to(PACKAGE).as_posix(): plumbing_imports(path.read_text())
             for path in sorted(PACKAGE.rglob("*.py"))}
    assert {path: lines for path, lines in found.items() if lines} == {}


def test_the_plumbing_check_sees_lazy_and_dynamic_imports():
    source = ("import os\nfrom ppbook import launch\n\n"
              "def hook():\n    from ppbook_tools import zygote\n    return zygote\n\n"
              "class A:\n    def f(self):\n        import ppbook_tools.zygote\n"
              "        return importlib.import_module('ppbook_tools.zygote')\n")
    assert plumbing_imports(source) == ["5: ppbook_tools", "10: ppbook_tools.zygote", "11: ppbook_tools.zygote"]
