"""Every acceptance rule, apart from the drafters (which propose and observe only); each module's job:
docs/ARCHITECTURE.md, "Verification"."""
