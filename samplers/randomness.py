"""Random numbers for the sampling core: one seeded torch.Generator on the model's device, and
counter-based Gumbel noise for Gumbel coupling.

All sampling is by race: ``argmax(probs / E)`` with E ~ Exp(1) picks index i with probability
probs[i] (equivalent to the Gumbel-max trick), never picks a zero-probability index, and is a
batched tensor op with no host sync.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def make_generator(seed: int, device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return g


# The smallest and largest Exp(1) values a race can use: float32 uniforms have 24 bits, so
# u in [2^-25, 1 - 2^-25] maps every draw into the OPEN interval (0, inf) of E.
_U_MIN = 2.0 ** -25


def exponential_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise in the open interval (0, inf) from uniforms u in [0, 1): never 0 (a rand() of
    exactly 0 happens with probability 2^-24 per element, i.e. in most images of a real model) and
    never inf."""
    return -torch.log1p(-u.clamp(min=_U_MIN))  # u = 0 -> E ~ 3e-8 > 0; u <= 1 - 2^-24 -> E < 17


class Draws:
    """The random draws of one generation's steps from its seeded generator, made when asked (the
    eager step). ``tape``: a list that records (kind, arguments) of every draw, in order: what a
    compiled step replays (`ReplayedDraws`)."""

    def __init__(self, generator: torch.Generator, device, tape: "list | None" = None):
        self.generator, self.device, self.tape = generator, device, tape

    def rand(self, shape) -> torch.Tensor:
        """Uniforms in [0, 1) of `shape`."""
        return self._draw("rand", tuple(shape))

    def randint(self, low: int, high: int, shape) -> torch.Tensor:
        """Integers uniform in [low, high) of `shape` (long)."""
        return self._draw("randint", tuple(shape), low, high)

    def _draw(self, kind: str, shape: tuple, *bounds) -> torch.Tensor:
        if self.tape is not None:
            self.tape.append((kind, shape) + bounds)
        if kind == "rand":
            return torch.rand(shape, generator=self.generator, device=self.device)
        return torch.randint(bounds[0], bounds[1], shape, generator=self.generator, device=self.device)

    def replay(self, tape: list) -> tuple:
        """The draws of a recorded tape made again from the generator, in its order: the numbers a step
        with that tape would draw now (every kind and shape is fixed by the step's plan)."""
        return tuple(self._draw(kind, shape, *bounds) for kind, shape, *bounds in tape)


class ReplayedDraws:
    """A compiled step's draws: dynamo cannot call a torch.Generator, so the engine makes the step's
    draws before the graph runs (`Draws.replay` of the tape its first, eager, run recorded) and the
    step takes them in the order it asks for them: the same numbers as the eager step."""

    def __init__(self, drawn: tuple):
        self.drawn, self.next = drawn, 0

    def rand(self, shape) -> torch.Tensor:
        return self._take(tuple(shape), torch.float32)

    def randint(self, low: int, high: int, shape) -> torch.Tensor:
        return self._take(tuple(shape), torch.long)

    def _take(self, shape: tuple, dtype) -> torch.Tensor:
        x = self.drawn[self.next]
        if tuple(x.shape) != shape or x.dtype != dtype:  # a tape of another plan: never silently other numbers
            raise RuntimeError(f"replayed draw {self.next} is {tuple(x.shape)} {x.dtype}, the step asked for "
                               f"{shape} {dtype}: the step's draws do not follow its plan")
        self.next += 1
        return x


def sample_by_race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Index drawn from ``probs`` [..., V] using Exp(1) noise of the same shape.

    Zero-probability entries are masked out of the race (key -1), not merely made small: a
    positive p whose key underflows to 0 still beats every masked entry, and ties among positive
    keys pick a positive entry. So the winner always has p > 0 (for a row with any mass)."""
    keys = probs / noise
    return torch.where(probs > 0, keys, -1.0).argmax(-1)


def race_keys(p: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    """log p + G [..., V]: the target's sample is its argmax (a zero-probability token has key -inf)."""
    return p.clamp(min=0).log() + gumbel


def gumbel_coupling(p: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    """argmax(log p + G) with G fixed per position for the whole generation: distributed as p,
    and two drafts of one position under nearby p's agree with high probability (SCD, Alg. 4)."""
    return race_keys(p, gumbel).argmax(-1)


def gumbel_top_k(q: torch.Tensor, gumbel: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest of log q + G [..., V], best first: k draws without replacement from q, the
    first of them `gumbel_coupling(q, G)` (a position's sibling drafts in the agreement mode)."""
    return race_keys(q, gumbel).topk(k, dim=-1).indices


def _mulmod32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2**32 without int64 overflow: split x into 16-bit halves
    return ((x & 0xFFFF) * c + ((((x >> 16) * c) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # "lowbias32" integer hash (Chris Wellons): good avalanche, cheap, exact in int64 arithmetic
    x = x ^ (x >> 16)
    x = _mulmod32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mulmod32(x, 0x846CA68B)
    return x ^ (x >> 16)


def gumbel_key(seed: int) -> int:
    """32-bit key of a 64-bit seed (computed once per generation, on the host)."""
    s = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    hi = int(_mix32(torch.tensor(s >> 32)))
    return int(_mix32(torch.tensor((s & _M32) ^ hi)))


def position_gumbel(key: int, rows: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [..., V] that depends only on (seed key, image row, absolute position, token):
    the same vector every time a position is drafted during one generation (Gumbel coupling),
    independent across positions, rows and seeds. ``rows`` and ``positions`` broadcast."""
    h = _mix32((rows.long() & _M32) ^ key)
    h = _mix32(h ^ (positions.long() & _M32))
    tokens = torch.arange(vocab_size, device=positions.device)
    h = _mix32(h[..., None] ^ tokens)
    u = ((h >> 8).to(torch.float64) + 0.5) / float(1 << 24)  # (0, 1), 24 bits
    return -torch.log(-torch.log(u)).to(torch.float32)


# A table of the position noise of a whole generation is built when it takes at most this many
# bytes (a 48x48 image over 8192 codes needs 77 MB per image row); larger ones are hashed per step.
GUMBEL_TABLE_BYTES = 1 << 28


class PositionNoise:
    """G[b, j, :] = position_gumbel(seed, b, j) for every image row b of a generation and every
    absolute sequence position j < `positions`: looked up in a table built at the first call when it
    fits in GUMBEL_TABLE_BYTES (`tabled`; over a whole image steps * slots >= positions, so the table
    is also less work), else hashed on demand. The same values either way, on any machine (integer
    hashing, one float64 -> float32 rounding). `greedy` (temperature 0): zeros, never hashed: every p is one-hot,
    so argmax(log p + G) is the argmax whatever G is, and hashing [B, T, V] per step was most of a greedy run."""

    def __init__(self, seed: int, batch: int, positions: int, vocab_size: int, device, greedy: bool = False):
        self.key, self.greedy = gumbel_key(seed), greedy
        self.vocab_size, self.positions = vocab_size, positions
        self.rows = torch.arange(batch, device=device)
        self.table = None
        self.tabled = batch * positions * vocab_size * 4 <= GUMBEL_TABLE_BYTES

    def __call__(self, pos: torch.Tensor) -> torch.Tensor:
        """pos [B, ...] absolute positions of each row -> noise [B, ..., V]."""
        if self.greedy:
            return torch.zeros(*pos.shape, self.vocab_size, device=pos.device)
        rows = self.rows.view(-1, *([1] * (pos.dim() - 1)))
        if self.tabled and self.table is None:
            self.table = position_gumbel(self.key, self.rows[:, None],
                                         torch.arange(self.positions, device=self.rows.device)[None], self.vocab_size)
        if self.table is not None:
            return self.table[rows, pos.clamp(0, self.positions - 1)]
        return position_gumbel(self.key, rows, pos, self.vocab_size)
