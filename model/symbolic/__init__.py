"""The symbolic side of the model: policy cores over `ops` (one definition, run on ints or on Z3
terms), request slots, and the cores' concrete runner. The searches and proofs built on them live
in checkers/, above properties/."""
