"""Planting a bug in a core and its policy alike, for as long as a `with` block lasts.

A `Patch` replaces one exact piece of a module's source (it must occur once). `planted(patches)`
recompiles each top-level class or function the patches touch from the patched source, at its own
line numbers, in the module's namespace; swaps it in there and wherever another module imported it by
name (and a registered core or policy in `CORES` / `POLICIES` for an instance of the patched class),
as an edit of the file would reach it; registers the patched text with `linecache`, so
that what reads the code that runs (checkers/parametric/sealed.py) reads the patched code; and
puts everything back afterwards. Nothing is written to disk. proofs/mutants.py holds the bugs.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import linecache
import sys
from pathlib import Path

import model.policies  # noqa: F401  (registers the policies)
import model.symbolic.cores  # noqa: F401  (registers the cores)
from model.policy import POLICIES
from model.symbolic.core import CORES

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Patch:
    module: str     # dotted name, e.g. "model.symbolic.cores.vllm_v1"
    old: str        # an exact piece of the source, found once
    new: str


def _patched_text(module, patches: list[Patch]) -> str:
    text = Path(module.__file__).read_text()
    for p in patches:
        found = text.count(p.old)
        if found != 1:
            raise ValueError(f"{p.module}: the piece to replace occurs {found} times, not once: {p.old[:60]!r}")
        text = text.replace(p.old, p.new)
    return text


def _touched(tree: ast.Module, text: str, original: str) -> list[ast.stmt]:
    """The top-level classes and functions whose source differs from the original's."""
    before = {n.name: ast.get_source_segment(original, n) for n in ast.parse(original).body
              if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    return [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
            and ast.get_source_segment(text, n) != before.get(n.name)]


@contextlib.contextmanager
def planted(patches: list[Patch]):
    by_module: dict[str, list[Patch]] = {}
    for p in patches:
        by_module.setdefault(p.module, []).append(p)
    saved_names, saved_lines = [], {}
    saved_cores, saved_policies = dict(CORES), dict(POLICIES)
    try:
        for name, ps in by_module.items():
            module = importlib.import_module(name)
            path = module.__file__
            original = Path(path).read_text()
            text = _patched_text(module, ps)
            tree = ast.parse(text)
            saved_lines[path] = linecache.cache.get(path)
            lines = text.splitlines(keepends=True)
            linecache.cache[path] = (len(text), None, lines, path)
            for node in _touched(tree, text, original):
                old = module.__dict__[node.name]
                saved_names.append((module, node.name, old))
                # in the module's own namespace, so the new code and the old see each other's new versions
                # (a decorator such as `register` registers the new class)
                exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), module.__dict__)
                # ... and wherever another module imported it by name, as an edit of the file would reach it
                for other in list(sys.modules.values()):
                    names = getattr(other, "__dict__", {})
                    for attr, value in list(names.items()):
                        if value is old and other is not module:
                            saved_names.append((other, attr, old))
                            names[attr] = module.__dict__[node.name]
        yield
    finally:
        for module, name, value in reversed(saved_names):
            module.__dict__[name] = value
        for path, entry in saved_lines.items():
            if entry is None:
                linecache.cache.pop(path, None)
            else:
                linecache.cache[path] = entry
        CORES.clear()
        CORES.update(saved_cores)
        POLICIES.clear()
        POLICIES.update(saved_policies)
