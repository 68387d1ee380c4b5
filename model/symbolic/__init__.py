"""The symbolic side of the model: policy cores over `ops`, their concrete runner, and the Z3
checks built on them (bounded model checking, acceleration, induction)."""
