"""environment.yml (conda, Binder) describes the same environment as requirements.txt."""

import re

import yaml

from conftest import ROOT


def requirement_lines(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def test_environment_yml_matches_requirements():
    pins = requirement_lines((ROOT / "requirements.txt").read_text())
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(pins) == sorted(p for p in pip if p != "-e .")
    assert "-e ." in pip  # the shared package
    assert "python=3.11" in env["dependencies"]


def test_pins_are_exact_and_torch_is_the_cpu_wheel_version():
    pins = requirement_lines((ROOT / "requirements.txt").read_text())
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.]+", p) for p in pins), pins
    assert "torch==2.13.0" in pins
    jb = next(p for p in pins if p.startswith("jupyter-book=="))
    assert jb.split("==")[1].startswith("1."), "Jupyter Book 2.x cannot build offline"
