"""The library's source files as the installed package names them (shared by the source-walking tests)."""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def package_modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """Every module of the installed package by dotted name, found through pyproject.toml's package-dir."""
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    out: dict[str, pathlib.Path] = {}
    for package, folder in tool["package-dir"].items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out
