"""No sentence on any docs page runs past 50 words.

A reader who must hold sixty words in mind to find the verb skips the sentence, and with it the one fact it
carried. The count is of prose as a reader meets it: code blocks are left out, a link counts as its text, inline
code as one word, and each table cell, list item and heading stands alone.
"""
from __future__ import annotations

import re

from tests.conftest import DOC_PAGES, ROOT

LIMIT = 50
# a sentence ends at . ! ? (or a colon or semicolon closing a clause) followed by a space and then a capital,
# a digit, a quote, a bracket or a backtick; "e.g. x" and "1.5 ms" do not end one
END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bvs\.)(?<=[.!?])\s+(?=[A-Z0-9\"'(`*\[])")


def _blocks(text: str) -> list[str]:
    """Paragraphs, list items, headings and table cells, each as one string; code blocks dropped."""
    blocks, current, code = [], [], False

    def close():
        if current:
            blocks.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            code = not code
            continue
        if code:
            continue
        if stripped.startswith("|"):
            close()
            blocks.extend(cell for cell in stripped.strip("|").split("|") if cell.strip(" -:"))
            continue
        if (not stripped or stripped.startswith("#") or re.match(r"([-*+]|\d+\.)\s", stripped)
                or stripped.startswith(("!!!", "???", ">"))):
            close()
        if stripped:
            current.append(re.sub(r"^([-*+]|\d+\.|>+)\s+", "", stripped))
    close()
    return blocks


def long_sentences(text: str, limit: int = LIMIT) -> list[tuple[int, str]]:
    """(words, first words) of each sentence over `limit` words."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    found = []
    for block in _blocks(text):
        block = re.sub(r"`[^`]*`", "CODE", block)
        block = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", block)
        block = re.sub(r"<[^>]+>", " ", block)
        for sentence in END.split(block):
            words = sentence.split()
            if len(words) > limit:
                found.append((len(words), " ".join(words[:12])))
    return found


def test_the_count_splits_sentences_cells_and_items_and_skips_code():
    long = " ".join(["Word"] + ["word"] * 50)
    text = (f"Short one. {long}.\n\n| a | {long} |\n|---|---|\n\n- item one\n- {long}\n\n"
            f"```\n{long}\n```\nA `{long}` code span and [a link]({'x' * 60}) e.g. here.")
    assert [n for n, _ in long_sentences(text)] == [51, 51, 51]
    assert long_sentences(" ".join(["w"] * 50) + ".") == []
    # an abbreviation does not end a sentence, even before inline code or a capital
    assert [n for n, _ in long_sentences("A setting, e.g. `x`, i.e. The one vs. Other " + " ".join(["w"] * 42))] == [51]


def test_no_sentence_on_any_page_runs_past_50_words():
    problems = [f"{page.relative_to(ROOT)}: {n} words: {start} …" for page in DOC_PAGES
                for n, start in long_sentences(page.read_text())]
    assert problems == [], f"{len(problems)} sentences over {LIMIT} words; split them:\n" + "\n".join(problems)
