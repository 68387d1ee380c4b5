"""The layering of ARCHITECTURE.md, checked over the imports of every module:

    model  <-  properties  <-  checkers  <-  proofs  <-  schedproof (the command line)
    model  <-  properties  <-  targets   <-  schedproof

A package imports only from the layers below it (and itself). model/ holds the semantics and
knows nothing of being checked; no module below the command line hides a project import inside a
function (the way to dodge an import cycle), and only the command line prints."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("model", "properties", "checkers", "proofs", "targets", "schedproof")
ALLOWED = {
    "model": {"model"},
    "properties": {"model", "properties"},
    "checkers": {"model", "properties", "checkers"},
    "proofs": {"model", "properties", "checkers", "proofs"},
    "targets": {"model", "properties", "targets"},
    "schedproof": set(PROJECT),
}
# Where a function-level import is allowed: the command line defers what one subcommand needs
# (the engines behind `fuzz`, Z3 behind `check` and `prove`) so that `run` starts fast; a target
# imports its engine only when it is driven (the engines are an optional install).
LAZY_OK = {"schedproof/cli.py", "targets/transformers_cb.py"}


def modules(package: str):
    return sorted((ROOT / package).rglob("*.py"))


def imports(path: Path, root: Path = ROOT):
    """(line, imported project package, at module level?) for every import of the file."""
    tree = ast.parse(path.read_text())
    package = path.relative_to(root).parts[0]
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [package] if node.level else [node.module or ""]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            if root in PROJECT:
                yield node.lineno, root, id(node) in top


@pytest.mark.parametrize("package", PROJECT)
def test_a_package_imports_only_the_layers_below_it(package):
    wrong = [f"{p.relative_to(ROOT)}:{line} imports {root}" for p in modules(package)
             for line, root, _ in imports(p) if root not in ALLOWED[package]]
    assert not wrong, wrong


def test_no_project_import_is_hidden_in_a_function():
    hidden = [f"{p.relative_to(ROOT)}:{line} imports {root} inside a function"
              for package in PROJECT for p in modules(package)
              if str(p.relative_to(ROOT)) not in LAZY_OK
              for line, root, at_top in imports(p) if not at_top]
    assert not hidden, hidden


def test_only_the_command_line_prints():
    printing = []
    for package in ("model", "properties", "checkers", "proofs", "schedproof"):
        for p in modules(package):
            if p.name == "cli.py":
                continue
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    printing.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert not printing, printing


def test_the_walk_sees_a_wrong_import(tmp_path):
    """The check can fail: model importing the checkers, and properties imported in a function."""
    bad = tmp_path / "model" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import os\nfrom checkers import bmc\n\ndef f():\n    from properties import REGISTRY\n")
    assert sorted(imports(bad, tmp_path)) == [(2, "checkers", True), (5, "properties", False)]
