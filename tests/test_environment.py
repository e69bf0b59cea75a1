"""The environments agree: environment.yml (conda) is requirements.txt (the developer's), which
includes requirements-reader.txt (the reader's), which binder/requirements.txt repeats."""

import re

import yaml

from conftest import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
DEVELOPER_ONLY = ("jupyter-book", "pytest", "playwright", "ray", "sphinx")


def requirement_lines(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def pins(path) -> list[str]:
    """The requirements of a pip file, ``-r`` expanded (the install cell of every notebook reads them so)."""
    from make_notebooks import requirement_pins

    return requirement_pins(path)


def name(pin: str) -> str:
    return re.split(r"[=\[<>]", pin)[0].lower()


def test_environment_yml_matches_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(pins(ROOT / "requirements.txt")) == sorted(p for p in pip if p != "-e .")
    assert "-e ." in pip  # the shared package
    assert "python=3.11" in env["dependencies"]


def test_pins_are_exact_and_torch_is_the_cpu_wheel_version():
    all_pins = pins(ROOT / "requirements.txt")
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.]+", p) for p in all_pins), all_pins
    assert len({name(p) for p in all_pins}) == len(all_pins), "a package pinned twice"
    assert "torch==2.13.0" in all_pins
    jb = next(p for p in all_pins if p.startswith("jupyter-book=="))
    assert jb.split("==")[1].startswith("1."), "Jupyter Book 2.x cannot build offline"


def test_reader_environment_is_lean_and_inside_the_developers():
    reader = pins(ROOT / "requirements-reader.txt")
    assert "-r requirements-reader.txt" in requirement_lines((ROOT / "requirements.txt").read_text())
    assert set(reader) <= set(pins(ROOT / "requirements.txt"))
    assert "torch==2.13.0" in reader and any(p.startswith("myst-nb==") for p in reader)  # glue
    assert not [p for p in reader if name(p).startswith(DEVELOPER_ONLY)], reader


def test_binder_builds_the_reader_environment_with_cpu_torch():
    lines = requirement_lines((ROOT / "binder" / "requirements.txt").read_text())
    assert f"--extra-index-url {CPU_INDEX}" in lines
    assert sorted(pins(ROOT / "binder" / "requirements.txt")) == sorted(pins(ROOT / "requirements-reader.txt"))
    # repo2docker ignores the root's environment files once binder/ exists: no Binder-only file there
    assert not (ROOT / "postBuild").exists()


def test_makefile_and_readme_name_the_cpu_torch_knob():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH_INDEX \?=", makefile, re.M)
    assert "--index-url $(TORCH_INDEX)" in makefile
    readme = (ROOT / "README.md").read_text()
    assert f"TORCH_INDEX={CPU_INDEX}" in readme and "requirements-reader.txt" in readme
