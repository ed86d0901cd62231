"""The shape of the code (docs/architecture.md): small modules, layers that import downwards only,
and citations that a reader of the repository can open."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("estimator", "calibrate")
SOURCES = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
MAX_MODULE_LINES = 450

# Layer of each part of the code, bottom first: a module may import from its own layer or any below it.
LAYERS = {
    "estimator.errors": 0, "estimator.units": 0, "estimator.formatting": 0,
    "estimator.specs": 1,
    "estimator.efficiency": 2,
    "calibrate": 2.5,            # measures a device and writes a profile; the evaluation only reads profiles
    "estimator.physics": 3,
    "estimator.serving": 4,
    "estimator.evaluation": 5,
    "estimator.validation": 6,
    "estimator.planning": 7,
    "estimator.reporting": 8,
    "estimator.cli": 9, "estimator": 9,   # the package root re-exports the public API
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> float | None:
    """The layer of the longest prefix of ``module`` in LAYERS (None for outside code)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every import of project code in a file, top-level or inside functions, as (line, module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from estimator.physics import flops` imports the module estimator.physics.flops
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in PACKAGES]


def test_every_module_has_a_layer():
    assert [_module_name(p) for p in SOURCES if _layer(_module_name(p)) is None] == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_layers_import_downwards_only(path):
    own = _layer(_module_name(path))
    upward = [f"line {line}: {name}" for line, name in _imports(path) if _layer(name) > own]
    assert upward == [], f"{path.relative_to(ROOT)} (layer {own}) imports from a layer above it"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_over_450_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


# A citation of a document: a path with a folder (docs/formulas.md), or a capitalised document name
# (README.md). A bare lower-case name (report.md) is an output file, not a citation.
CITATION = re.compile(r"(?<![\w/.])(?:(?:\.\./)*(?:[\w-]+/)+[\w-]+|[A-Z][A-Z_-]+)\.md\b")
STEERING_FOLDER = "../" + "shared"
CITING_FILES = sorted([*SOURCES, *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
                       *(ROOT / "notebooks").glob("*.ipynb"), ROOT / "pyproject.toml"])
# Markdown files that exist in the repository, relative to its root.
REPO_DOCUMENTS = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.md") if ".venv" not in str(p) and ".git" not in p.parts}
REPO_DOCUMENT_NAMES = {Path(d).name for d in REPO_DOCUMENTS}


def _outside(citation: str) -> bool:
    return citation not in REPO_DOCUMENTS if "/" in citation else citation not in REPO_DOCUMENT_NAMES


def test_the_design_documents_exist():
    for name in ("architecture", "formulas", "conventions"):
        assert (ROOT / "docs" / f"{name}.md").stat().st_size > 2000


@pytest.mark.parametrize("path", CITING_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_citations_stay_inside_the_repository(path):
    text = path.read_text()
    outside = [m for m in CITATION.findall(text) if _outside(m)]
    assert outside == [], f"{path.relative_to(ROOT)} cites documents that are not in the repository"
    assert STEERING_FOLDER not in text, "the code may not refer to a folder outside the repository"


def test_cited_formula_sections_exist():
    formulas = (ROOT / "docs" / "formulas.md").read_text()
    headings = set(re.findall(r"^#{2,4} (\d+(?:\.\d+)?)\b", formulas, re.M))
    cited = set()
    for path in CITING_FILES:
        for group in re.findall(r"docs/formulas\.md((?:,? ?§\d+(?:\.\d+)?)+)", path.read_text()):
            cited |= set(re.findall(r"§(\d+(?:\.\d+)?)", group))
    assert cited and cited <= headings, f"cited sections missing from docs/formulas.md: {sorted(cited - headings)}"


DATA_FILES = sorted([*(ROOT / "hardware_db").rglob("*.yaml"), *(ROOT / "models_db").glob("*.yaml"),
                     *(ROOT / "engines_db").glob("*.yaml"), *(ROOT / "measurements_db").glob("*.md"),
                     *(ROOT / "docs").glob("*.md"), ROOT / "README.md"])


@pytest.mark.parametrize("path", DATA_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_data_and_docs_point_at_no_developer_machine(path):
    """Sources are published documents (URLs, other projects' files) or this repository, never a local path."""
    text = path.read_text()
    assert STEERING_FOLDER not in text and "/work/" not in text
