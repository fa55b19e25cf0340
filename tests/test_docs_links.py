"""A cross-reference in the docs is a Markdown link, so the strict MkDocs build checks that it leads somewhere.

A "see below" or "see Quick start" in plain words points at whatever the section was called when it was
written; after a rename nothing fails and the reader lands nowhere. Text inside code blocks and inline code is
left alone (a YAML comment cannot hold a link); a sentence there points at a paragraph of links instead.
"""
from __future__ import annotations

import re

from tests.conftest import DOC_PAGES, ROOT

# "see" followed by below/above, a quoted title, or a capitalised title of up to five words
REFERENCE = re.compile(r"\b[Ss]ee (below|above|\"[^\"]+\"|[A-Z][\w-]*(?: [\w-]+){0,4})")


def unlinked_references(text: str) -> list[tuple[int, str]]:
    """(line, words) of each "see X" outside code whose next few words hold no Markdown link."""
    found, code = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            code = not code
            continue
        if code:
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        for match in REFERENCE.finditer(prose):
            if "](" not in prose[match.start():match.end() + 40]:
                found.append((number, prose[match.start():match.end() + 30].strip()))
    return found


def test_the_rule_finds_a_plain_reference_and_passes_a_link_and_code():
    text = ("The gate decides (see below).\nSee Quick start for the run.\n"
            "see [the gate](guides/gate.md#the-release-gate) and [below](#x)\n"
            "```yaml\nx: 1  # see \"Tracking\" below\n```\n`see above` in code\nsee the numbers, not a title")
    assert [n for n, _ in unlinked_references(text)] == [1, 2]


def test_every_cross_reference_in_the_docs_is_a_link():
    problems = [f"{page.relative_to(ROOT)}:{line}: {words}" for page in DOC_PAGES
                for line, words in unlinked_references(page.read_text())]
    assert problems == [], "make each a Markdown link, so mkdocs build --strict checks it:\n" + "\n".join(problems)
