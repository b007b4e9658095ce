"""Every acceptance rule, apart from the drafters (which propose and observe only).

- rejection.py: rejection sampling of chains, sibling candidates and trees (lossless in distribution)
- agreement.py: agreement with the target's own sample ("same image as AR"; the Gumbel race helpers: randomness.py)
- relaxed.py: LANTERN's relaxed acceptance (LOSSY, opt-in)
- step.py: `verify`, the engine's entry point: a proposal and the target p -> the step's `Verdict`

The first three are pure batched tensor functions (randomness passed in): the statistical tests drive them.
"""
