"""Word-level prompt encoding of the demo model: the words of the procedural prompts, plus one
id for any other word (so every string is a valid prompt)."""
from __future__ import annotations

import re

from .data import WORDS

UNKNOWN = "<unk>"
VOCAB = [UNKNOWN] + list(WORDS)


def word_encoder(offset: int):
    index = {w: i for i, w in enumerate(VOCAB)}

    def encode(text: str) -> list:
        return [offset + index.get(w, 0) for w in re.findall(r"[a-z]+", text.lower())]

    return encode
