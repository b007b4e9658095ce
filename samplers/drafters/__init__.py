"""Drafting methods, one module per method (see base.py for the protocol):

- jacobi.py: AR, SJD, SCD and SJD-PAC (Jacobi iteration, couplings, proactive trees)

A backend's parameter schema (samplers/backends.py) names its drafter class.
"""
