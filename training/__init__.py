"""Training of drafters on a frozen target (self-distillation): `python -m specar train-drafter`.

- selfdistill.py: sequences the target samples from prompts, teacher-forced through the target
  for its hidden states and target distributions (the shared data of every drafter kind)
"""
