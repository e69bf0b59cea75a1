"""The core path is a first read of about ninety minutes (issue 50): the introduction and chapters
1, 2, 3 and 5 show at most 12,000 words without opening anything (code and outputs included),
chapter 5 at most 3,500, and no paragraph of their prose carries more than three numbers.
Counted on the built HTML by ``tools/visible_words.py``."""

from __future__ import annotations

import pytest

import visible_words as vw  # tools/, on the path from conftest

PAGE = """<html><body><article>
<h1>Title<a class="headerlink" href="#">#</a></h1>
<p>One two three.</p>
<p>At p = 4 and m = 8 the bubble is 27.3% of the step, 37.5% of the ideal time.</p>
<p>Figure 3 shows rank 2 and stage 1 at 5 and 6 and 7.</p>
<ul><li>an item with 1, 2, 3 and 4</li><li><p>a paragraph in an item: 1 2 3 4</p></li></ul>
<div class="cell_output"><div class="output"><pre>10 20 30 40 50</pre></div></div>
<table><tr><td>1 2 3 4 5</td></tr></table>
<details><summary>hidden</summary><p>1 2 3 4 5 6 words words</p></details>
<div class="admonition dropdown"><p>How this was checked 1 2 3 4 5</p></div>
<div class="cell tag_hide-input"><div class="cell_input">import torch</div>
<div class="cell_output">shown</div></div>
<div class="cell tag_remove-cell"><p>removed 1 2 3 4</p></div>
</article><footer>not in the article</footer></body></html>"""


def test_the_counter_sees_what_a_reader_sees():
    words, heavy = vw.count(PAGE)
    # the title, four paragraphs of prose, two items, the output, the table and the hidden input's
    # output: the headerlink, the collapsed blocks, the hidden input and the removed cell are gone
    assert words == 1 + 3 + 20 + 14 + 8 + 9 + 5 + 5 + 1, words
    # four numbers in a paragraph: heavy; numbers that name a figure, rank or stage do not count;
    # code, outputs, tables and collapsed blocks are not prose
    assert heavy == ["At p = 4 and m = 8 the bubble is 27.3% of the step, 37.5% of the ideal time.",
                     "an item with 1, 2, 3 and 4", "a paragraph in an item: 1 2 3 4"], heavy
    assert vw.numbers("Figure 3 shows rank 2 and stage 1 at 5 and 6 and 7.") == 3
    assert vw.numbers("1.5x faster, 12,000 words, 3 %") == 3


def test_the_command_refuses_a_missing_page_in_one_line(tmp_path, capsys):
    assert vw.main([str(tmp_path), "00_intro.html"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist; build the book first" in err[0], err


@pytest.mark.book
def test_core_path_fits_its_reading_budget(built_book):
    counts = {name: vw.page(built_book / "book" / f"{name}.html") for name in vw.CORE_PATH}
    words = {name: w for name, (w, _) in counts.items()}
    table = ", ".join(f"{name} {w}" for name, w in words.items())
    assert sum(words.values()) <= vw.CORE_BUDGET, (
        f"the core path shows {sum(words.values())} words, over its budget of {vw.CORE_BUDGET} ({table}): move "
        "what an expert wants to a Going-deeper page, trim launch outputs, collapse the checks")
    for name, budget in vw.PAGE_BUDGET.items():
        assert words[name] <= budget, f"{name} shows {words[name]} words, over its budget of {budget} ({table})"
    heavy = {name: h for name, (_, h) in counts.items() if h}
    assert not heavy, (f"paragraphs with more than {vw.NUMBER_LIMIT} numbers (put the rest in a table or a collapsed "
                       "block): " + "; ".join(f"{name}: {p[:90]}..." for name, ps in heavy.items() for p in ps))
