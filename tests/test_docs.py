"""The user docs in ``docs/``: every ```python block runs, the configuration page matches carls.yaml.

Every page of ``docs/`` is found by its file name (a new page is tested without being listed here).
Blocks of one page run in order in one namespace, in a fresh Python process whose working folder is
a temporary one (so relative run folders land there). A block fenced ```python no-run is skipped; it
is allowed only for code that needs a Slurm cluster, and must say so in its first line. The README
links every page, and every relative link of the README and the pages names a file that exists (and,
for a page, a heading that exists).
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest
import yaml

from carls_dask import config

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = tuple(sorted(page.stem for page in DOCS.glob("*.md")))
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
PAGE_TIMEOUT = 600  # seconds all blocks of one page may take

RUNNER = r"""
import json, sys
page, blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__docs__"}
for line, source in blocks:
    print(f"--- {page}:{line}", flush=True)
    exec(compile(source, f"{page}:{line}", "exec"), namespace)
print("--- all blocks ran", flush=True)
"""


def python_blocks(page: pathlib.Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``(runnable, skipped)`` python blocks of a page as ``(first line number, source)``."""
    text = page.read_text()
    run, skip = [], []
    for m in FENCE.finditer(text):
        info = m.group("info").strip().split()
        if not info or info[0] != "python":
            continue
        line = text.count("\n", 0, m.start("body")) + 1
        (skip if "no-run" in info[1:] else run).append((line, m.group("body")))
    return run, skip


def test_every_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(PAGES) >= 10, f"found only {PAGES} in {DOCS}"
    missing = [name for name in PAGES if f"](docs/{name}.md" not in readme]
    assert not missing, f"README.md does not link docs/{', docs/'.join(missing)}.md"


@pytest.mark.parametrize("name", PAGES)
def test_skipped_blocks_are_slurm_only_and_say_so(name: str) -> None:
    _, skipped = python_blocks(DOCS / f"{name}.md")
    for line, source in skipped:
        first = source.lstrip().splitlines()[0]
        assert "Slurm" in first, f"docs/{name}.md:{line}: a no-run block must be Slurm-only and say so first"


LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<title>.+?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """``text`` without its fenced blocks (their ``#`` lines are not headings, their brackets not links)."""
    return FENCE.sub("", text)


def anchors(page: pathlib.Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(_prose(page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", m.group("title").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def broken_links(page: pathlib.Path) -> list[str]:
    """Relative links of ``page`` whose file (or, for a page, heading) does not exist."""
    broken = []
    for m in LINK.finditer(_prose(page.read_text())):
        target = m.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no file {file})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.name})")
    return broken


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{name}.md" for name in PAGES)])
def test_relative_links_resolve(page: str) -> None:
    broken = broken_links(ROOT / page)
    assert not broken, f"{page} links to what does not exist: {broken}"


def test_a_broken_link_is_found(tmp_path: pathlib.Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading, with punctuation\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#a-code-heading-with-punctuation) [ok](#page) [web](https://x.org/y)\n"
                    "[gone](missing.md) [bad anchor](other.md#nowhere)\n```text\n[in a block](ignored.md)\n```\n")
    assert broken_links(page) == [f"missing.md (no file {tmp_path / 'missing.md'})",
                                  "other.md#nowhere (no heading #nowhere in other.md)"]


@pytest.mark.slow
@pytest.mark.timeout(PAGE_TIMEOUT + 60)
@pytest.mark.parametrize("name", PAGES)
def test_python_blocks_run(name: str, tmp_path: pathlib.Path) -> None:
    blocks, _ = python_blocks(DOCS / f"{name}.md")
    if not blocks:
        pytest.skip(f"docs/{name}.md has no python blocks")
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER], input=json.dumps([f"docs/{name}.md", blocks]), cwd=tmp_path,
        capture_output=True, text=True, timeout=PAGE_TIMEOUT,
    )
    assert proc.returncode == 0, f"docs/{name}.md failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    assert proc.stdout.count("--- docs/") == len(blocks)
    assert proc.stdout.rstrip().endswith("--- all blocks ran")


# -- configuration.md against carls.yaml and carls-schema.yaml ---------------------------------------
BEGIN, END = "<!-- keys:begin -->", "<!-- keys:end -->"


def _schema_node(schema: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node = schema["properties"]["carls"]
    for part in path:
        node = node["properties"][part]
    return node


def configuration_table() -> str:
    """The key table of docs/configuration.md: every key of carls.yaml, its default and its schema description."""
    defaults = config.load_defaults()["carls"]
    schema = yaml.safe_load(config.SCHEMA_PATH.read_text())
    rows = ["| key | default | meaning |", "|---|---|---|"]

    def walk(tree: dict[str, Any], path: list[str]) -> None:
        for key, value in tree.items():
            node = _schema_node(schema, [*path, key])
            if isinstance(value, dict) and value:
                rows.append(f"| **`carls.{'.'.join([*path, key])}`** | | {node['description']} |")
                walk(value, [*path, key])
                continue
            shown = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            rows.append(f"| `carls.{'.'.join([*path, key])}` | `{shown}` | {node['description']} |")

    walk(defaults, [])
    return "\n".join(rows)


def test_configuration_page_lists_every_key_with_its_default_and_meaning() -> None:
    text = (DOCS / "configuration.md").read_text()
    assert BEGIN in text and END in text, f"docs/configuration.md lost its {BEGIN} / {END} markers"
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == configuration_table(), (
        "docs/configuration.md is out of step with carls_dask/carls.yaml / carls-schema.yaml; "
        "regenerate its key table with `python tests/test_docs.py`")


def write_configuration_table() -> None:
    """Rewrite the key table of docs/configuration.md from carls.yaml and carls-schema.yaml."""
    path = DOCS / "configuration.md"
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{configuration_table()}\n{END}{tail}")


if __name__ == "__main__":
    write_configuration_table()
