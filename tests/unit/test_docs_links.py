"""Every relative link in the project's Markdown resolves: the file exists inside the
repository, and a ``#anchor`` names a heading of that file (GitHub's slugs). Pages moved
between README.md and docs/ often; a link left behind fails here, naming the page."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in listed.stdout.split()]


def slugs(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces
    to hyphens, a repeated heading numbered ``-1``, ``-2``..."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2)).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", words).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    bad = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(root) or not dest.exists():
            bad.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in slugs(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading with that anchor")
    return bad


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_the_page_resolves(page: Path) -> None:
    assert not broken_links(page)


def test_a_link_to_a_missing_page_or_heading_is_found(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# There\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n[ok](#top) [ok](there.md#there) [gone](no-such-page.md) [lost](#nowhere) [out](../x.md)\n"
        "```\n[in code](ignored.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page, root=tmp_path) == [
        "no-such-page.md: no such file in the repository",
        "#nowhere: no heading with that anchor",
        "../x.md: no such file in the repository",
    ]


def test_headings_get_githubs_anchors() -> None:
    assert slugs("# Why not jsonrpcserver?\n## Speed\n## Speed\n") == {"why-not-jsonrpcserver", "speed", "speed-1"}
