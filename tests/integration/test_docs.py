"""Static checks of the documentation: README.md, services/README.md and docs/*.md.

The README stays a front door (short, and linking every page of docs/); every relative link of
these pages leads to a file of the repository, and to a heading of it when it names one; and no
page points at documents the repository does not hold: a design file, "seed" documents, issue
numbers. No server is needed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, ROOT / "services" / "README.md", *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 260

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)

OUTSIDE_REFERENCES = {
    "a design file": re.compile(r"\bDESIGN\b"),
    "a section number of another document": re.compile(r"§\s*\d"),
    "a seed document": re.compile(r"\bseeds?\b", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE),
}


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans (their brackets are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        name, n = base, 0
        while name in found:  # GitHub numbers repeated headings: x, x-1, x-2
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text(encoding="utf-8")))


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail into docs/"
    )


def test_readme_links_every_docs_page() -> None:
    linked = {
        (README.parent / target.split("#", 1)[0]).resolve()
        for target in links(README)
        if not SCHEME.match(target) and not target.startswith("#")
    }
    missing = [page_id(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        if SCHEME.match(target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page.resolve()
        if not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {page_id(dest)}")
    assert not broken, f"{page_id(page)}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_references_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    found = [
        f"line {text.count(chr(10), 0, m.start()) + 1}: {what} ({m.group(0)!r})"
        for what, pattern in OUTSIDE_REFERENCES.items()
        for m in pattern.finditer(text)
    ]
    assert not found, (
        f"{page_id(page)} points outside the repository; describe the requirement instead: {found}"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("## Orchestration (seed 003, issue 7)", {"a seed document", "an issue number"}),
        (
            "see `../shared/DESIGN.md` and DESIGN §4",
            {"a design file", "a section number of another document"},
        ),
        ("done (issue 9)", {"an issue number"}),
        ("the seeds' tables", {"a seed document"}),
        ("a seeded read model; seeding 1,000 factories; nats.py PR #1008", set()),
    ],
)
def test_outside_reference_patterns(text: str, expected: set[str]) -> None:
    found = {what for what, pattern in OUTSIDE_REFERENCES.items() if pattern.search(text)}
    assert found == expected
