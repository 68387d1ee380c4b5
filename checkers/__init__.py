"""The checkers above the model: searches and proofs over the policy cores of model/symbolic/.

model/ holds the semantics (state, policies, ops, slots, cores) and knows nothing of being checked;
this package holds what checks it: `space` (a design with ranges as Z3 terms and constraints),
`bmc` (bounded model checking), `induction` (inductive invariants and the no-progress obligation),
`accel` (decode runs as one transition, proved sound), `replay` (every solver trace replayed in both
simulators) and `differential` (simulator vs core, the tests' link between the two semantics).
Layering: model <- properties <- checkers <- proofs <- schedproof; nothing here prints.
"""
