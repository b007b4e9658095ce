"""Drafting methods (base.py: the protocol; they propose and observe, samplers/verification/ accepts).

- params.py: how a method declares its typed parameters (`param`) and itself (`Method`)
- one package per method, laid out alike: params.py, drafter.py (ending with its `Method`), network.py and
  files.py where it has a trained network (its training lives in training/): jacobi/ (AR, SJD, SCD,
  SJD-PAC), auto (the Jacobi family with its window chosen every step), hawk/, adt_tree/ (its EAGLE network:
  eagle/), spatial/
- hidden_states.py: the hidden-state store and q the trained drafters share; static_tree.py: best-first shapes

samplers/backends.py lists the methods in `METHODS` and derives the schema the nodes and docs read.
"""
