"""Drafting methods: the protocol (base.py; they propose and observe, samplers/verification/ accepts) and one package
per method, laid out alike; each package's job: docs/ARCHITECTURE.md, "Drafters". samplers/backends.py lists the
methods in `METHODS`."""
