"""Conclusions beside glued numbers are checked by the build (issue 13).

A heuristic: a sentence of a page's prose that shows a glued value (``{glue:text}`key```) and
uses a conclusive word ("fits", "faster", "fewer", "within", "equal", "never", ...) must glue at
least one of its keys through :func:`ppbook.claims.claim` on the same page, so that the
condition it states is asserted where the value is computed. Sentences that only report a
number next to such a word, and conclude nothing, are listed in ``ALLOWED`` with the reason.
"""

from __future__ import annotations

import re

import pytest

from conftest import ROOT

CONCLUSIVE = re.compile(
    r"\b(fits?|faster|slower|fewer|more than|less than|within|equals?|equal to|the same|matches|"
    r"at least|at most|never|always|exceeds?|bubble of|smaller|larger|shorter|longer|below|above|"
    r"only|all|every|none|no more|no less|twice|half|times (?:more|fewer|less|faster|slower))\b",
    re.IGNORECASE)
GLUE = re.compile(r"\{glue(?::text)?\}`([^`:]+)")
CLAIM_KEY = re.compile(r"\bclaim\(\s*(f?)([\"'])(.+?)\2")

# (page, a piece of the sentence): sentences with a glued number and a conclusive-looking word
# that conclude nothing from the number. Keep this list short; each entry says why.
ALLOWED: list[tuple[str, str, str]] = [
    ("04_splitting.md", "Each policy's split, the stage times it predicts",
     "introduces a table; the glued number is how many steps it shows"),
    ("07_checkpointing.md", "Saves took at most", "the glued value is the maximum itself"),
    ("09_scaling_out.md", "Executing this page took", "reports this build's page time"),
    ("explorer.md", "The planner predicts layouts in the order of a lower bound",
     "states the planner's stopping rule; the glued number is its parameter"),
    ("a2_myths.md", "All of it is checked with torch", "names the torch version"),
    ("a3_troubleshooting.md", "The messages below are those of torch", "names the torch version"),
    ("a3_troubleshooting.md", "here {glue:text}`hang_timeout` s", "the glued number is a flag value"),
    ("a3_troubleshooting.md", "Read the rank whose error is not", "the glued text is an error message"),
    ("05_schedules.md", "The fastest measured here", "names the minimum of measured step times (true by construction); a timing on a shared host is reported, not asserted"),
    ("11_on_real_gpus.md", "These are predictions, not measurements", "states the model's assumptions, concludes nothing"),
    ("11_on_real_gpus.md", "every launch passes, the", "lists what the next GPU run checks; concludes nothing yet"),
    ("13_moe.md", "In this build a perfect overlap would take",
     "reports this build's launch, its directions glued words; the conclusions are claims on the record"),
]


def claimed_keys(code: str) -> list[re.Pattern]:
    """A pattern per key glued through claim(...); f-string fields match any text."""
    out = []
    for is_f, _, key in CLAIM_KEY.findall(code):
        parts = re.split(r"\{[^}]*\}", key) if is_f else [key]
        out.append(re.compile(".+".join(map(re.escape, parts)) + r"\Z"))
    return out


def prose_and_code(text: str) -> tuple[str, str]:
    """The page's prose (outside fences and directive bodies) and its code cells, apart."""
    prose, code, fence = [], [], None
    for line in text.splitlines():
        stripped = line.strip()
        m = re.match(r"^(`{3,}|~{3,})(.*)", stripped)
        if fence is None and m:
            fence = (m.group(1), "code-cell" in m.group(2))
            prose.append("")
            continue
        if fence is not None:
            if stripped == fence[0]:
                fence = None
            elif fence[1]:
                code.append(line)
            elif not stripped.startswith(":"):
                prose.append(line)  # admonitions, exercises: their text is prose too
            continue
        prose.append(line)
    return "\n".join(prose), "\n".join(code)


def sentences(prose: str) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", prose):
        para = " ".join(para.split())
        out += [s for s in re.split(r"(?<=[.!?;:])\s+(?=[A-Z({*$`])", para) if s]
    return out


def unchecked(text: str, page: str = "page") -> list[str]:
    """Sentences with a glued value and a conclusive word, none of whose keys is a claim."""
    prose, code = prose_and_code(text)
    keys = claimed_keys(code)
    bad = []
    for s in sentences(prose):
        glued = GLUE.findall(s)
        if not glued or not CONCLUSIVE.search(GLUE.sub("", s)):
            continue
        if any(k.match(g) for g in glued for k in keys):
            continue
        if any(page == p and frag in s for p, frag, _ in ALLOWED):
            continue
        bad.append(s)
    return bad


PAGES = sorted(p for p in (ROOT / "book").glob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_conclusion_beside_a_glued_number_is_a_claim(page):
    bad = unchecked(page.read_text(), page.name)
    assert not bad, (f"{page.name}: these sentences conclude from glued numbers without a claim "
                     "(glue one of their keys with ppbook.claims.claim, or add the sentence to "
                     "ALLOWED if it concludes nothing):\n- " + "\n- ".join(bad))


def test_the_allow_list_has_no_stale_entries():
    for page, frag, why in ALLOWED:
        assert why, (page, frag)
        assert frag in " ".join((ROOT / "book" / page).read_text().split()), (page, frag)


SYNTHETIC = '''
# A page

```{code-cell} ipython3
glue("gain", 12.0, display=False)
claim("speedup", 1.4, 1.4 > 1, why="faster")
```

The pipeline is {glue:text}`gain:.0f`% faster than one process.

It is also {glue:text}`speedup:.1f` times faster, and that one is checked.

The run took {glue:text}`gain:.0f` s.
'''


def test_the_heuristic_fails_an_unchecked_conclusion_and_passes_a_checked_one():
    bad = unchecked(SYNTHETIC)
    assert bad == ["The pipeline is {glue:text}`gain:.0f`% faster than one process."]
    # the same sentence passes once its key is glued through claim(...)
    fixed = SYNTHETIC.replace('glue("gain", 12.0, display=False)', 'claim("gain", 12.0, True)')
    assert unchecked(fixed) == []


def test_f_string_claim_keys_cover_their_glued_names():
    page = ('```{code-cell} ipython3\nfor tag in ("a", "b"):\n    claim(f"{tag}_diff", 0.0, True)\n```\n\n'
            "Both differ by at most {glue:text}`a_diff:.1e` and {glue:text}`b_diff:.1e`.\n")
    assert unchecked(page) == []
