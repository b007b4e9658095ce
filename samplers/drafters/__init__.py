"""Drafting methods, one module (or package) per method (see base.py for the protocol):

- params.py: how a method declares its typed parameters (`param`) and itself (`Method`)
- jacobi.py: AR, SJD, SCD and SJD-PAC (Jacobi iteration, couplings, proactive trees)
- auto.py: the Jacobi family with its window chosen every step
- hawk/, eagle/ + adt_tree/, spatial/: the methods with trained drafters (network, files,
  drafter; their training lives in training/)
- hidden_states.py: the hidden-state store and q those drafters share

Each method module ends with its `Method` (name, label, parameter dataclass, drafter class);
samplers/backends.py lists them in `METHODS` and derives the schema the nodes and docs read.
"""
