"""The operations a policy core is written in, and their two interpretations.

A core (model/symbolic/cores/) is ordinary Python over a fixed number of request slots that
never branches on a state value: every decision is `ops.ite`, every conjunction `ops.and_`.
Arithmetic (`+ - *`) and comparisons are Python operators, which work on ints and on Z3 terms
alike. Run with `Concrete`, a core is a simulator step on ints and bools; run with `Symbolic`,
the same code builds the Z3 transition relation. One definition, two interpretations.

`Symbolic` folds constants as it goes (an `ite` on a Python bool picks its branch), so a core
run on a partly concrete state builds only the terms that are really unknown. A core that
branches on a Z3 term with a plain `if` fails loudly (Z3 refuses to turn a term into a bool).
"""

from __future__ import annotations

import contextlib
from typing import Any

import z3

# The sort numbers get when terms are created. Proofs use integers (unbounded). The bounded
# unrolling uses 32-bit vectors: it is control-heavy with small numbers, where bit-blasting to SAT
# beats integer arithmetic; a space bounds every input (space.MAX_VALUE) so that no value a core
# computes comes near 2^31, and signed bit-vector arithmetic then equals integer arithmetic.
SORT = "int"
WIDTH = 32


@contextlib.contextmanager
def sort(name: str):
    global SORT
    saved, SORT = SORT, name
    try:
        yield
    finally:
        SORT = saved


def int_var(name: str):
    return z3.Int(name) if SORT == "int" else z3.BitVec(name, WIDTH)


def num(value: int):
    return z3.IntVal(value) if SORT == "int" else z3.BitVecVal(value, WIDTH)


def as_int(v) -> int:
    return v.as_long() if z3.is_int_value(v) else v.as_signed_long()


def cdiv_int(a: int, b: int) -> int:
    return -(-a // b)


class Concrete:
    """Python ints and bools."""

    symbolic = False

    def ite(self, c, a, b):
        return a if c else b

    def and_(self, *xs) -> bool:
        return all(xs)

    def or_(self, *xs) -> bool:
        return any(xs)

    def not_(self, x) -> bool:
        return not x

    def implies(self, a, b) -> bool:
        return (not a) or b

    def min(self, a, b):
        return a if a <= b else b

    def max(self, a, b):
        return a if a >= b else b

    def div(self, a, b):
        """Floor division; cores only divide non-negative numbers by positive ones."""
        return a // b

    def cdiv(self, a, b):
        return cdiv_int(a, b)

    def pages(self, tokens, block_size):
        """The KV pages that hold `tokens` tokens (Knobs.blocks_for)."""
        return cdiv_int(max(tokens, 0), block_size)

    def sum(self, xs):
        return sum(xs)

    def count(self, bs):
        return sum(1 for b in bs if b)

    def eq(self, a, b):
        return a == b


def _is_const(x) -> bool:
    return isinstance(x, (bool, int))


class Symbolic:
    """Z3 terms, with Python constants folded."""

    symbolic = True

    def ite(self, c, a, b):
        if isinstance(c, bool):
            return a if c else b
        if _is_const(a) and _is_const(b) and a is b:
            return a
        if _is_const(a) and _is_const(b) and type(a) is type(b) and a == b:
            return a
        if not _is_const(a) and not _is_const(b) and a.eq(b):
            return a
        if isinstance(a, bool) and isinstance(b, bool):
            return c if a else z3.Not(c)
        if isinstance(a, int) and not isinstance(a, bool):
            a = num(a)
        if isinstance(b, int) and not isinstance(b, bool):
            b = num(b)
        return z3.If(c, a, b)

    def and_(self, *xs):
        terms = []
        for x in xs:
            if x is False:
                return False
            if x is not True:
                terms.append(x)
        if not terms:
            return True
        return terms[0] if len(terms) == 1 else z3.And(*terms)

    def or_(self, *xs):
        terms = []
        for x in xs:
            if x is True:
                return True
            if x is not False:
                terms.append(x)
        if not terms:
            return False
        return terms[0] if len(terms) == 1 else z3.Or(*terms)

    def not_(self, x):
        if isinstance(x, bool):
            return not x
        return z3.Not(x)

    def implies(self, a, b):
        return self.or_(self.not_(a), b)

    def min(self, a, b):
        if _is_const(a) and _is_const(b):
            return min(a, b)
        return self.ite(a <= b, a, b)

    def max(self, a, b):
        if _is_const(a) and _is_const(b):
            return max(a, b)
        return self.ite(a >= b, a, b)

    def div(self, a, b):
        if _is_const(a) and _is_const(b):
            return a // b
        return a / b   # Z3 integer division; equals floor division for a positive divisor

    def cdiv(self, a, b):
        if _is_const(a) and _is_const(b):
            return cdiv_int(a, b)
        return (a + b - 1) / b

    def pages(self, tokens, block_size):
        return self.cdiv(self.max(tokens, 0), block_size)

    def sum(self, xs):
        xs = list(xs)
        const = sum(x for x in xs if _is_const(x))
        terms = [x for x in xs if not _is_const(x)]
        if not terms:
            return const
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return total + const if const else total

    def count(self, bs):
        return self.sum(self.ite(b, 1, 0) for b in bs)

    def eq(self, a, b):
        if _is_const(a) and _is_const(b):
            return a == b
        return a == b


class _InTheCurrentContext:
    """A class attribute made anew in Z3's current context at each read: a declaration made once, at import, would
    belong to the context current then, and a term of another context cannot use it (checkers/clock.py
    `fresh_context` gives each search and each test its own). Z3 makes one declaration of a name and sort per
    context, so every read in one context is the same function."""

    def __init__(self, make):
        self.make = make

    def __get__(self, obj, owner):
        return self.make()


class MonotonePages(Symbolic):
    """`Symbolic` with the page count of a token count left uninterpreted: `pages(t)` is
    PAGES(max(t, 0)) for a function PAGES of which a query knows only what `page_facts` states
    (PAGES(0) = 0, no value below 0, never smaller for more tokens), not the division.

    A formula valid for every such function is valid for cdiv(., b) with any b >= 1, which is
    one of them; so a proof over this interpretation is a proof over `Symbolic`. It is much
    cheaper for the solver when what a proof needs of pages is only their order (acceleration:
    a decode run of m steps takes the pages of m more tokens, each step never fewer than the
    last), where integer division makes it case-split on remainders. A proof that needs more
    of the division fails here and is asked again over `Symbolic`. PAGES stands for the division
    by the one block size of the query (every core counts pages through `Knobs.blocks_for`)."""

    PAGES = _InTheCurrentContext(lambda: z3.Function("pages", z3.IntSort(), z3.IntSort()))

    def pages(self, tokens, block_size):
        if _is_const(tokens):
            return cdiv_int(max(tokens, 0), block_size) if _is_const(block_size) else \
                self.PAGES(num(max(tokens, 0)))
        return self.PAGES(self.max(tokens, 0))


def page_facts(formulas) -> list:
    """What is true of cdiv(., b) for every b >= 1, for the `MonotonePages` applications in
    `formulas`: PAGES(0) = 0, each is at least 0, and pairwise, more tokens never take fewer pages."""
    seen, apps, todo = set(), [], [f for f in formulas if z3.is_expr(f)]
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_app(e) and e.decl().eq(MonotonePages.PAGES):
            apps.append(e)
        todo.extend(e.children())
    zero = MonotonePages.PAGES(z3.IntVal(0))
    facts = [zero == 0] + [a >= 0 for a in apps]
    for i, a in enumerate(apps):
        for b in apps[i + 1:]:
            x, y = a.arg(0), b.arg(0)
            facts += [z3.Implies(x <= y, a <= b), z3.Implies(y <= x, b <= a)]
    return facts


class Guarded:
    """Imperative code over terms: assignments made inside `when(c)` take effect only where c
    holds (each becomes `ite(guard, new, old)`), so a core reads like the engine's own code.

    On `Concrete` ops, `Guarded(ops)` is a `_ConcreteGuarded`: the same assignments, made or skipped
    by a Python `if` instead of through `ops.ite` (the differential tests' concrete runs make tens of
    millions of them)."""

    def __new__(cls, ops):
        if cls is Guarded and not ops.symbolic:
            cls = _ConcreteGuarded
        return super().__new__(cls)

    def __init__(self, ops):
        self.ops = ops
        self.guard: Any = True

    def when(self, cond) -> "_When":
        """`with G.when(cond):` the block's assignments guarded by cond as well (a class, not a
        contextlib generator: the concrete runs of the differential tests enter millions of these)."""
        return _When(self, cond)

    def set(self, table: dict, key: str, value) -> None:
        table[key] = self.ops.ite(self.guard, value, table[key])

    def add(self, table: dict, key: str, delta) -> None:
        self.set(table, key, table[key] + delta)


class _When:
    """The context of `Guarded.when`: the guard narrowed on entry, restored on exit."""

    __slots__ = ("G", "cond", "saved")

    def __init__(self, G: Guarded, cond):
        self.G, self.cond = G, cond

    def __enter__(self) -> None:
        self.saved = self.G.guard
        self.G.guard = self.G.ops.and_(self.saved, self.cond)

    def __exit__(self, *exc) -> None:
        self.G.guard = self.saved


class _ConcreteGuarded(Guarded):
    """`Guarded` on Python values: the guard is a bool, and `ite(guard, new, old)` an `if`."""

    def when(self, cond) -> "_ConcreteWhen":
        return _ConcreteWhen(self, cond)

    def set(self, table: dict, key: str, value) -> None:
        if self.guard:
            table[key] = value


class _ConcreteWhen(_When):
    """`_When` on Python values: `Concrete.and_` inlined."""

    __slots__ = ()

    def __enter__(self) -> None:
        self.saved = guard = self.G.guard
        self.G.guard = guard and bool(self.cond)
