"""Training of drafters on a frozen target (self-distillation): `python -m specar train-drafter`. selfdistill.py: the
data every kind shares; loop.py: the loop; hawk.py, eagle.py, spatial.py: one per trained method (`Method.train`
names it), importing the method's network from samplers/drafters/, which never imports training/."""
