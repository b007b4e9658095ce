"""Every acceptance rule, apart from the drafters that propose (they propose and observe only).

- rejection.py: rejection sampling of chains, sibling candidates and trees (mrs, residual, verify_chain,
  verify_candidates, verify_tree, maximal_coupling); lossless in distribution
- agreement.py: verification by agreement with the target's own sample ("same image as AR": race_keys,
  agree_chain, agree_tree, agree_candidates) and the Gumbel couplings drafters draw with
- relaxed.py: LANTERN's relaxed acceptance (LOSSY, opt-in)
- step.py: `verify`, the engine's one entry point: a proposal and the target p -> the step's `Verdict`,
  the step's randomness drawn from the loop state

The first three are pure batched tensor functions (randomness passed in): the statistical tests drive
them directly.
"""
