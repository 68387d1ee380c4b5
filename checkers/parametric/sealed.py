"""Sealed one-request steps: what makes "for any number of requests" follow from checked facts.

A one-request argument (local.py for trtllm_v1) proves a claim on `Core.step` run for one request
whose reads of the others come from an environment (`Plan`'s declared reads: a fresh term each).
That step stands for the step of any request among any number of others only if

1. the core runs the same code with and without an environment, apart from the declared reads
   themselves (`mode_blind`: no function of the core's modules looks at the environment but the
   plumbing that passes a value through or replaces it);
2. what the request's step computes depends on the others only through those reads, and not on
   how many others there are or where the request stands among them.

Then the n-slot step gives slot i what the environment step gives the request at the same place
among n - 1 others, with the recorded values in place of the fresh terms (same code, different
values at the reads), and that is what the one-slot step gives it. (2) is checked here on the
terms the core builds, not assumed:

- **phantoms** (`layout`): the step is built with the request among other requests whose every
  field and workload parameter is a fresh constant named `phantom!...`, and so is every value read
  at another request's turn (`PhantomReads`). A term of the request's outputs that contains one
  reads another request without naming it: a count over the slots, a position in a list, a field
  of another request. This is exact for the layout: a term is a function of its constants.
- **layouts** (`uniform`): the request's outputs (its fields after the step, its record entries, the
  order of its reads, and of the running values the argument reasons about what its turns hand on
  to the next read and the loop's first value) are the *same terms* (Z3 hash-conses them) at every
  layout with up to L requests before it and L after it as alone.
  So neither a slot index nor the slot count decides them up to L. L is above every integer
  constant the step's code compares or computes with (`structure_bound`: the functions of
  model/ that a step build runs, read with `ast`, and the design's concrete numbers):
  a predicate of the request's index and the count with such constants takes the values it can
  take on the layouts checked (a polynomial's roots lie within one plus its largest coefficient
  ratio, Cauchy's bound). A bound above `MAX_BOUND` is reported, not assumed.

Each failure is one line naming the output and the layout; the argument then does not say
"for any number of requests". docs/symbolic.md, "Any number of requests: the checked route".
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import linecache
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

import z3

from model.symbolic.slots import Knobs, Params, SlotState

from ..encode import PARAM_TYPES, fresh_params_slots, fresh_state, var

PHANTOM = "phantom!"
ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "model"
# the layouts always reach this far, whatever the constants
MIN_BOUND = 4
# past this many requests on either side the layouts are too costly to build: a larger bound is
# reported as a failed premise, never assumed
MAX_BOUND = 24


def phantom_in(terms: Iterable) -> Optional[str]:
    """The name of a phantom constant some term contains, or None."""
    seen, todo = set(), [t for t in terms if z3.is_expr(t)]
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED and e.decl().name().startswith(PHANTOM):
            return e.decl().name()
        todo.extend(e.children())
    return None


@dataclasses.dataclass
class Layout:
    """The request at index `own` among `before` phantom requests and `after` more."""
    state: SlotState
    params: Params
    own: int


def layout(core, before: int, after: int, tag: str, pin: Optional[dict] = None) -> Layout:
    """A pre-state and workload with the request's fields named as alone (`fresh_state(core, 1, tag)`)
    and every other request's fields and parameters phantom constants; `pin`: workload fields the
    claim's class fixes for every request."""
    own = fresh_state(core, 1, tag)
    own_w = {**fresh_params_slots(1, f"{tag}.w")[0], **(pin or {})}

    def phantom(j: int) -> tuple[dict, dict]:
        fields = {f: var(f"{PHANTOM}{j}.{f}", t) for f, t in core.req_fields().items()}
        w = {**{f: var(f"{PHANTOM}{j}.w.{f}", t) for f, t in PARAM_TYPES.items()}, **(pin or {})}
        return fields, w
    others = [phantom(j) for j in range(before + after)]
    req = [f for f, _ in others[:before]] + [own.req[0]] + [f for f, _ in others[before:]]
    slots = [w for _, w in others[:before]] + [own_w] + [w for _, w in others[before:]]
    return Layout(SlotState(req, own.g), Params(slots), before)


class PhantomReads:
    """An environment's naming of its fresh terms: the request's own reads and the reads once a loop
    is over by name and occurrence (the same at every layout), a read at another request's turn a
    phantom constant (what the request's step may never depend on)."""

    def __init__(self, tag: str, own: int):
        self.tag, self.own = tag, own
        self.occurrences: dict = {}
        # every read in program order: (name, slot or None, the value passed in, the term returned)
        self.sequence: list[tuple] = []

    def role(self, i) -> str:
        return "end" if i is None else "own" if i == self.own else f"other{i}"

    def fresh(self, name: str, value, i, make: Callable) -> object:
        key = (name, self.role(i))
        k = self.occurrences.get(key, 0)
        self.occurrences[key] = k + 1
        prefix = "" if i is None or i == self.own else PHANTOM
        term = make(f"{prefix}{self.tag}.{name}.{key[1]}.{k}", value)
        self.sequence.append((name, i, value, term))
        return term

    def handoffs(self) -> dict:
        """What each of the request's turns hands on, by `handoff.NAME.K`, and each loop's first value,
        by `start.NAME` (`handoffs`)."""
        return handoffs([(name, i, value) for name, i, value, _ in self.sequence], self.own)


def handoffs(sequence: list[tuple], who) -> dict:
    """From reads in program order, (name, slot or None, the value passed in): for the K-th read of NAME
    at slot `who`, the value passed into the next read of NAME (the next request's turn, its own next
    turn, or the loop's end: what its turn hands on), by `handoff.NAME.K`; and the value passed into
    the first read of each NAME `who` reads (the loop's first value, whoever's turn it is), by
    `start.NAME`."""
    out, firsts, mine = {}, {}, {}
    for at, (name, i, value) in enumerate(sequence):
        firsts.setdefault(name, value)
        if i == who:
            k = mine.get(name, 0)
            mine[name] = k + 1
            nxt = next((v for n2, _, v in sequence[at + 1:] if n2 == name), None)
            if nxt is not None:
                out[f"handoff.{name}.{k}"] = nxt
    out.update({f"start.{name}": v for name, v in firsts.items() if name in mine})
    return out


def outputs(post: SlotState, record, own: int, reads: PhantomReads, uses: Iterable[str] = (),
            extra: Optional[dict] = None) -> dict:
    """What the request's step gives it and what the argument reads of its turns, by name: its fields,
    its record entries, the order of its own reads and, for each running value in `uses`, what its
    turns hand on and the loop's first value. (A value the argument does not use may depend on the
    others: the free count a loop starts from is theirs too.)"""
    out = {f"post.{f}": v for f, v in post.req[own].items()}
    out["tokens"] = record.tokens[own]
    out.update({f"flag.{f}": v[own] for f, v in record.flags.items()})
    out["error"] = record.error
    out["reads"] = tuple(name for name, i, _, _ in reads.sequence if i == own or i is None)
    uses = tuple(uses)
    out.update({key: v for key, v in reads.handoffs().items() if key.split(".", 1)[1].rsplit(".", 1)[0] in uses
                or key.split(".", 1)[1] in uses})
    out.update(extra or {})
    return out


def _same(a, b) -> bool:
    if z3.is_expr(a) and z3.is_expr(b):
        return a.eq(b)
    if z3.is_expr(a) or z3.is_expr(b):
        return False
    return type(a) is type(b) and a == b


def uniform(build: Callable[[int, int], dict], bound: int) -> tuple[str, str]:
    """`build(before, after)`: the request's outputs at that layout. Proved when every layout with at
    most `bound` requests on either side gives the same terms as the request alone; else the first
    output that differs, and whether it reads another request or only its place."""
    # An output some layouts lack (a turn's handoff when no read of its name follows: alone, the last
    # turn of a loop with no read at its end) is compared where it exists, with the first layout that has it.
    reference: dict = {}
    for before in range(bound + 1):
        for after in range(bound + 1):
            got = build(before, after)
            where = "alone" if before == after == 0 else f"with {before} request(s) before it and {after} after"
            for name in sorted(got):
                b = got[name]
                leak = phantom_in([b]) if z3.is_expr(b) else None
                if leak:
                    return "failed", f"the request's {name} reads another request ({leak}) without naming it, {where}"
                a = reference.setdefault(name, b)
                if not _same(a, b):
                    return "failed", f"the request's {name} depends on its place among the others, {where}"
            missing = [name for name in reference if name not in got and not name.startswith("handoff.")]
            if missing:
                return "failed", f"the request's {missing[0]} depends on its place among the others, {where}"
    return "proved", ""


# -- the layouts' reach: the constants the step's code uses ------------------------------------------
def executed_functions(build: Callable[[], object]) -> set[tuple[str, int]]:
    """(file, first line) of every function of model/ that `build()` runs."""
    ran: set = set()
    prefix = str(MODEL) + "/"

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(prefix):
            ran.add((frame.f_code.co_filename, frame.f_code.co_firstlineno))
    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        build()
    finally:
        sys.setprofile(old)
    return ran


def _module(path: str) -> tuple[ast.Module, dict]:
    """A module's syntax tree and its integer constants, from the source the interpreter runs (`linecache`:
    the file, or the text a module was compiled from where that was registered, as for a planted mutant)."""
    return _parse("".join(linecache.getlines(path)))


@functools.lru_cache(maxsize=64)
def _parse(text: str) -> tuple[ast.Module, dict]:
    tree = ast.parse(text)
    named = {}
    for node in tree.body:   # module constants: NAME = <int>
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and type(node.value.value) is int:
            named.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return tree, named


def _functions(tree: ast.Module) -> dict[int, ast.AST]:
    """Function and lambda nodes by every line a code object of theirs may start at."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            out[node.lineno] = node
            for d in getattr(node, "decorator_list", []):
                out[d.lineno] = node
    return out


def _int_value(node: ast.AST, named: dict) -> Optional[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _int_value(node.operand, named)
        return None if v is None else -v
    if isinstance(node, ast.Name) and node.id in named:
        return named[node.id]
    return None


def code_constants(ran: set[tuple[str, int]]) -> list[tuple[int, str]]:
    """The integer constants the functions `ran` compare, compute, slice, index or bound a range with:
    (value, file:line). A constant computed only with other constants (10 ** 6) is not one."""
    found = []
    for path, first in ran:
        tree, named = _module(path)
        node = _functions(tree).get(first)
        if node is None:
            continue
        for sub in ast.walk(node):
            operands = []
            if isinstance(sub, ast.Compare):
                operands = [sub.left, *sub.comparators]
            elif isinstance(sub, ast.BinOp):
                a, b = _int_value(sub.left, named), _int_value(sub.right, named)
                operands = [] if (a is None) == (b is None) else [sub.left, sub.right]
            elif isinstance(sub, ast.AugAssign):
                operands = [sub.value]
            elif isinstance(sub, ast.Slice):
                operands = [x for x in (sub.lower, sub.upper, sub.step) if x is not None]
            elif isinstance(sub, ast.Subscript) and not isinstance(sub.slice, ast.Slice):
                operands = [sub.slice]
            elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in ("range", "min", "max"):
                operands = list(sub.args)
            for o in operands:
                v = _int_value(o, named)
                if v is not None:
                    found.append((abs(v), f"{Path(path).relative_to(ROOT)}:{o.lineno}"))
    return found


class _Watched(int):
    """A design's number that notes when Python code compares it (with anything but a Z3 term, which builds a
    term instead): only such a comparison could decide the code's structure."""

    def __new__(cls, value: int, name: str, seen: set):
        out = super().__new__(cls, value)
        out.name, out.seen = name, seen
        return out

    def _note(self, other) -> None:
        if not z3.is_expr(other):
            self.seen.add((int(self), self.name))

    def __eq__(self, other):
        self._note(other)
        return int(self) == other

    def __ne__(self, other):
        self._note(other)
        return int(self) != other

    def __lt__(self, other):
        self._note(other)
        return int(self) < other

    def __le__(self, other):
        self._note(other)
        return int(self) <= other

    def __gt__(self, other):
        self._note(other)
        return int(self) > other

    def __ge__(self, other):
        self._note(other)
        return int(self) >= other

    __hash__ = int.__hash__


class _Watching:
    """A design's options whose integers are `_Watched`."""

    def __init__(self, options, seen: set):
        self._options, self._seen = options, seen

    def __getattr__(self, name: str):
        v = getattr(self._options, name)
        return _Watched(v, f"option {name}", self._seen) if type(v) is int else v


def watched(k, seen: set):
    """The knobs with every concrete number watched (`_Watched`), options included."""
    numbers = {name: _Watched(v, f"knob {name}", seen) for name in (*Knobs.NUMERIC, "chunk_unit")
               if type(v := getattr(k, name)) is int}
    return dataclasses.replace(k, options=_Watching(k.options, seen), **numbers)


def structure_bound(build: Callable, k) -> tuple[int, str]:
    """(L, what sets it): past every constant `build(k)` (a step) uses, by two (module docstring): the integer
    constants of the code that ran, and the design's numbers the code compared at Python level (a number only
    built into terms cannot decide the code's structure)."""
    seen: set = set()
    ran = executed_functions(lambda: build(watched(k, seen)))
    consts = code_constants(ran) + sorted(seen)
    top = max(consts, default=(0, "no constant"))
    return max(MIN_BOUND, top[0] + 2), top[1]


# -- the core runs the same code with or without an environment ----------------------------------------
# The functions that may look at the environment: each passes a value through, or replaces it with the
# environment's (the declared reads), or hands the environment what it records. Anything else that does
# would run code in one mode and not the other.
PLUMBING = {
    "model/symbolic/core.py": {"Plan.__init__", "Plan.seen", "Plan.at_turn", "Plan.decided", "Plan.note",
                               "Core.step"},
    "model/symbolic/cores/trtllm_v1.py": {"_Pass.env", "_Pass.seen", "_Pass.seen_sum", "_Pass.capacity_outcome"},
    "model/symbolic/cores/trtllm_v2.py": {"TrtllmV2Core.step"},   # hands it to `Core.step`, or runs without one
    "model/symbolic/cores/sglang.py": {"SglangCore.step"},        # hands it to `Core.step`, or refuses the overlap loop
}
ENV_NAMES = {"env", "one_request", "one"}


def _qualified(tree: ast.Module):
    """(qualified name, node) for every function, methods as Class.method."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{sub.name}", sub


def mode_blind(modules: Iterable[str]) -> tuple[str, str]:
    """Whether only the plumbing of `modules` (paths from the repository root) looks at an
    environment (an attribute or name `env`, `one_request`, `one`); else where the others do."""
    where = []
    for rel in modules:
        tree, _ = _module(str(ROOT / rel))
        allowed = PLUMBING.get(rel, set())
        for name, node in _qualified(tree):
            if name in allowed:
                continue
            lines = sorted({sub.lineno for sub in ast.walk(node)
                            if (isinstance(sub, ast.Attribute) and sub.attr in ENV_NAMES) or
                            (isinstance(sub, ast.Name) and sub.id in ENV_NAMES)})
            if lines:
                where.append(f"{rel}:{lines[0]} {name}")
    if not where:
        return "proved", ""
    more = f" and {len(where) - 3} more" if len(where) > 3 else ""
    return "failed", (f"the core runs other code for one request than for all: {', '.join(where[:3])}{more} "
                      f"look at the environment")


def premise(modules: Iterable[str]) -> tuple:
    """`mode_blind` as an argument's first part: (action, name, status, seconds, reason)."""
    t0 = time.monotonic()
    st, why = mode_blind(modules)
    return ("sealed", "one code with or without an environment", st, time.monotonic() - t0, why)
