"""The demo's prompt judge (tooling/demo_judge.py, behind `evaluate-demo`): it tells an image's own prompt from
another one's."""
import numpy as np

from specar.tooling.demo_data import dataset
from specar.tooling.demo_judge import PromptJudge


def test_judge_tells_right_from_wrong_prompts():
    judge = PromptJudge(train_images=1500)
    images, prompts, _ = dataset(120, seed=99)
    right = np.mean([judge.judge(im, p)["ok"] for im, p in zip(images, prompts)])
    wrong = np.mean([judge.judge(im, prompts[(k + 1) % 120])["ok"] for k, im in enumerate(images)])
    assert right > 0.85 and wrong < 0.05
