"""The basics an open book needs: licenses, a valid citation, a contribution guide, edit and
issue buttons, and the page of execution times."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from conftest import ROOT
import make_notebooks as mn

# Citation File Format 1.2.0: the keys every CITATION.cff must have, and the type of each key
# this one uses (https://github.com/citation-file-format/citation-file-format/blob/main/schema.json).
CFF_REQUIRED = {"cff-version", "message", "title", "authors"}
CFF_TYPES = {"cff-version": str, "message": str, "title": str, "authors": list, "type": str,
             "abstract": str, "repository-code": str, "url": str, "license": (str, list),
             "version": str, "date-released": str, "keywords": list}


def citation() -> dict:
    return yaml.safe_load((ROOT / "CITATION.cff").read_text())


def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def test_citation_cff_has_the_required_keys_and_valid_values():
    cff = citation()
    assert CFF_REQUIRED <= cff.keys(), CFF_REQUIRED - cff.keys()
    assert cff["cff-version"] == "1.2.0"
    for key, value in cff.items():
        assert key in CFF_TYPES, f"CITATION.cff: unknown key {key!r}"
        assert isinstance(value, CFF_TYPES[key]), (key, value)
    # each author is a person (family-names) or an entity (name)
    assert cff["authors"] and all({"family-names", "name"} & a.keys() for a in cff["authors"])
    assert cff["type"] in ("software", "dataset")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(cff["date-released"]))
    # the same version and repository as the package and the book's configuration
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cff["version"] == version
    assert cff.get("repository-code") == mn.repository(), "CITATION.cff names another repository than _config.yml"


def test_licenses_cover_code_and_text_and_the_readme_says_which():
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert "CC BY 4.0" in (ROOT / "LICENSE-text.md").read_text()
    assert set(citation()["license"]) == {"MIT", "CC-BY-4.0"}
    readme = (ROOT / "README.md").read_text()
    assert "MIT" in readme and "CC BY 4.0" in readme and "LICENSE-text.md" in readme


def test_contributing_explains_how_to_add_a_chapter():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    for needed in ("_toc.yml", "book/NN_slug.md", "scripts/NN_slug.py", "glue:text", "claims.claim",
                   "make test-fast", "literalinclude"):
        assert needed in text, needed


def test_the_repository_is_one_setting_and_names_no_address_until_published():
    """No button may lead to a repository that does not exist: the address is one setting
    (``ppbook_repository``) that whoever publishes the book fills in, empty on main; the
    repository and launch buttons come from it alone (tools/ppbook_launch.py)."""
    assert config()["repository"] == {"url": ""} and "use_repository_button" not in config()["html"]
    assert mn.repository() is None or mn.repository().startswith("https://github.com/")
    for bad in ("github.com/a/b", "https://gitlab.com/a/b", "https://github.com/a"):
        with pytest.raises(ValueError, match="https://github.com/OWNER/REPO"):
            mn.check_repository(bad)
    assert mn.check_repository(" https://github.com/a/b/ ") == "https://github.com/a/b"


def test_execution_times_page_is_in_the_book():
    toc = (ROOT / "_toc.yml").read_text()
    assert "book/execution_times" in toc
    assert "```{nb-exec-table}" in (ROOT / "book" / "execution_times.md").read_text()


@pytest.mark.book
def test_execution_times_page_lists_every_executed_page(built_book):
    text = (built_book / "book" / "execution_times.html").read_text()
    for chapter in sorted((ROOT / "book").glob("*.md")):
        if "```{code-cell}" in chapter.read_text():
            assert f"book/{chapter.stem}" in text, chapter.name


def glossary_terms() -> list[str]:
    body = (ROOT / "book" / "glossary.md").read_text().split("```{glossary}")[1].split("\n```")[0]
    return [line for line in body.splitlines() if line and not line[0].isspace()]


def test_every_glossary_term_the_chapters_use_links_to_the_glossary():
    """A term the chapters use in prose is linked ({term}) at least once, where it first appears."""
    chapters = sorted((ROOT / "book").glob("[0-9][0-9]_*.md")) + sorted((ROOT / "book").glob("a[0-9]_*.md"))
    text = "\n".join(p.read_text() for p in chapters)
    linked = {m.group(2) or m.group(1) for m in re.finditer(r"\{term\}`([^`<]*?)\s*(?:<([^>]+)>)?`", text)}
    assert linked <= set(glossary_terms()), linked - set(glossary_terms())
    prose = re.sub(r"^(\s*`{3,}).*?^\1\s*$", "", text, flags=re.M | re.S)  # fenced code and directives
    prose = re.sub(r"^#.*$", "", prose, flags=re.M)  # headings
    prose = re.sub(r"\{[\w:-]+\}`[^`]*`|`[^`]*`", "", prose)  # roles and inline code
    used = {t for t in glossary_terms() if re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", prose, re.I)}
    assert used <= linked, f"glossary terms used in the chapters but never linked: {sorted(used - linked)}"
