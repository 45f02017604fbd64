"""Checks that every relative link of a built site resolves: the file exists and, when the
link names an anchor, the target page has an element with that id.

mkdocs --strict already refuses broken links between Markdown pages; this also covers
links written as HTML, the generated API reference, the navigation and the theme, and it
checks the anchors of the HTML that was actually produced. External links are counted,
not fetched (the build must work offline).

Usage: python checklinks.py SITE_DIR
"""

from __future__ import annotations

import os
import sys
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and tag != "meta":
                self.ids.add(value)
            elif (name == "href" and tag in ("a", "link", "area")) or (
                name == "src" and tag in ("img", "script", "iframe", "source")
            ):
                self.links.append(value)


def _parse(path: str, cache: dict[str, _Page]) -> _Page:
    page = cache.get(path)
    if page is None:
        page = _Page()
        with open(path, encoding="utf-8", errors="replace") as f:
            page.feed(f.read())
        cache[path] = page
    return page


def _target(site: str, page_path: str, url_path: str) -> str:
    # A root-absolute path (the theme writes them in 404.html) starts at the site root.
    base = site if url_path.startswith("/") else os.path.dirname(page_path)
    url_path = url_path.lstrip("/")
    path = os.path.normpath(os.path.join(base, unquote(url_path))) if url_path else page_path
    if os.path.isdir(path):
        path = os.path.join(path, "index.html")
    return path


def main(site: str) -> int:
    site = os.path.abspath(site)
    cache: dict[str, _Page] = {}
    pages = [
        os.path.join(d, f)
        for d, _, files in os.walk(site)
        for f in files
        if f.endswith(".html")
    ]
    broken: list[str] = []
    checked = external = 0
    for page_path in sorted(pages):
        for link in _parse(page_path, cache).links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//"):
                external += 1
                continue
            if not parts.path and not parts.fragment:
                continue  # href="" or "#"
            checked += 1
            target = _target(site, page_path, parts.path)
            rel = os.path.relpath(page_path, site)
            if not target.startswith(site + os.sep) and target != site:
                broken.append(f"{rel}: {link} points outside the site")
                continue
            if not os.path.exists(target):
                broken.append(f"{rel}: {link} -> missing file {os.path.relpath(target, site)}")
                continue
            if parts.fragment and target.endswith(".html"):
                if unquote(parts.fragment) not in _parse(target, cache).ids:
                    broken.append(f"{rel}: {link} -> no anchor #{parts.fragment} in {os.path.relpath(target, site)}")
    for b in broken:
        print("broken link:", b)
    print(
        f"checklinks: {len(pages)} pages, {checked} relative links checked, "
        f"{external} external links not fetched, {len(broken)} broken"
    )
    return 1 if broken else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
