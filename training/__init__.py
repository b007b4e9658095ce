"""Training of drafters on a frozen target (self-distillation): `python -m specar train-drafter`.

- selfdistill.py: sequences the target samples from prompts, teacher-forced through the target
  for its hidden states and target distributions (the shared data of every drafter kind)
- loop.py: the training loop (AdamW, schedule, checkpoints, resume)
- hawk.py, eagle.py, spatial.py: each trained method's training (`Method.train` names it); they
  import the method's network from samplers/drafters/, which never imports training/
"""
