"""The documentation's relative links lead somewhere: every linked file exists and every ``#anchor``
names a heading of the file it points into (as GitHub makes anchors). And the user-facing pages
stay short enough to read: the README the first hour, docs/results.md the current figures (the
studies behind them live in research/results_history.md)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "research").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if m and not fenced:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path):
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        for target in LINK.findall(line):
            if not target.startswith(("http://", "https://", "mailto:")):
                yield number, target


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    broken = []
    for number, target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


def test_the_user_pages_stay_short():
    assert len((ROOT / "docs" / "results.md").read_bytes()) <= 30_000  # the studies: research/results_history.md
    assert len((ROOT / "README.md").read_bytes()) <= 15_000


def test_the_anchor_rule():
    page = ROOT / "research" / "results_history.md"
    assert {"results-qwen35s-logits-against-float64", "the-tic-tac-toe-leagues-configuration-on-the-other-families",
            "a-pure-league-with-branch-credit-no-lookup-table"} <= anchors(page)
