"""The user docs in ``docs/``: every ```python block runs, the configuration page matches carls.yaml.

Blocks of one page run in order in one namespace, in a fresh Python process whose working folder is
a temporary one (so relative run folders land there). A block fenced ```python no-run is skipped; it
is allowed only for code that needs a Slurm cluster, and must say so in its first line.
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
PAGES = ("concepts", "bank-api", "slurm", "writing-a-maker", "writing-a-paradigm", "configuration", "dynamic-memory",
         "change-feeds", "shared-loading", "embeddings")
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


def test_every_page_exists_and_the_readme_links_it() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in PAGES:
        assert (DOCS / f"{name}.md").is_file(), f"docs/{name}.md is missing"
        assert f"](docs/{name}.md)" in readme, f"README.md does not link docs/{name}.md"


@pytest.mark.parametrize("name", PAGES)
def test_skipped_blocks_are_slurm_only_and_say_so(name: str) -> None:
    _, skipped = python_blocks(DOCS / f"{name}.md")
    for line, source in skipped:
        first = source.lstrip().splitlines()[0]
        assert "Slurm" in first, f"docs/{name}.md:{line}: a no-run block must be Slurm-only and say so first"


@pytest.mark.parametrize("name", PAGES)
def test_internal_links_resolve(name: str) -> None:
    text = (DOCS / f"{name}.md").read_text()
    for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", text):
        assert (DOCS / target).is_file(), f"docs/{name}.md links {target}, which does not exist"


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
