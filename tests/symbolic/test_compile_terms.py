"""differential.compile_terms: the compiled Python agrees with Z3's own evaluation, operator by
operator, on integers and 32-bit vectors (including division and remainder by negative numbers,
and the unsigned comparisons), and division by zero (unspecified in Z3) is refused, not guessed."""

import random

import pytest
import z3

from checkers.differential import compile_terms
from checkers.encode import as_int


def _z3_value(term, inputs, values):
    got = z3.simplify(z3.substitute(term, *[(v, z3.IntVal(x) if z3.is_int(v) else z3.BitVecVal(x, 32))
                                           for v, x in zip(inputs, values)]))
    return z3.is_true(got) if z3.is_bool(got) else as_int(got)


def _agree(terms, inputs, draw, runs=300):
    fn = compile_terms(terms, inputs)
    rng = random.Random(0)
    for _ in range(runs):
        values = [draw(rng) for _ in inputs]
        if any(v == 0 for v in values[1:2]):
            continue      # the divisor
        assert fn(values) == [_z3_value(t, inputs, values) for t in terms], values


def test_integer_operators():
    a, b, c = z3.Ints("a b c")
    terms = [a / b, a % b, a + b * c - a, -a, z3.If(a < b, a, c), z3.Xor(a > 0, b > 0), z3.Distinct(a, b, c),
             z3.Implies(a >= b, c <= a), z3.And(a == b, c != a), z3.Or(a > b, c < 0)]
    _agree(terms, [a, b, c], lambda rng: rng.randint(-20, 20))


def test_bit_vector_operators():
    a, b, c = z3.BitVecs("a b c", 32)
    terms = [a / b, a + b * c, a - b, -a, z3.ULT(a, b), z3.UGE(a, c), a <= b, z3.If(a > c, a, b)]
    _agree(terms, [a, b, c], lambda rng: rng.choice([rng.randint(-20, 20), rng.randint(-2 ** 31, 2 ** 31 - 1)]))


def test_division_by_zero_is_refused():
    a, b = z3.Ints("a b")
    for term in (a / b, a % b):
        with pytest.raises(ZeroDivisionError):
            compile_terms([term], [a, b])([5, 0])
