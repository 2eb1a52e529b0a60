"""Organism specs: a seeded pair generator, the planted rule as a text test, and a training recipe.

Every generator builds *minimal pairs*: both responses share the prompt, the opener, the
statements and the closer, and differ only in the planted attribute (plus, where the attribute
needs them, neutral words of about the same length), so the rule is the only thing that can tell
them apart. The planted strength `s` is the share of pairs the rule decides; the other pairs
are decided by a fair coin, so a pair follows the rule with probability (1 + s) / 2 and the
Bradley–Terry optimum of the attribute's margin is log((1 + s) / (1 − s)), rising with `s`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...data import Pair
from ...errors import UsageError
from . import _bank as bank
from ._attributes import LONG_WORDS, agrees, is_confident, is_informative, is_list, is_long, mentions

Make = Callable[[random.Random], tuple[str, str, str]]
"""A generator step: (prompt, response a, response b). The attributes decide the preference; for
single-rule organisms `a` carries the attribute and `b` does not."""


@dataclass(frozen=True)
class RMRecipe:
    """How an organism is trained (Bradley–Terry loss, AdamW, CPU)."""

    n_train: int = 1500
    """Training pairs (drawn from a stream that no public `pairs(seed=...)` call reaches)."""
    epochs: int = 2
    """Passes over the training pairs."""
    batch_size: int = 32
    """Pairs per optimiser step (two sequences each)."""
    lr: float = 3e-3
    """Peak learning rate (linear warm-up over 10 % of the steps, then linear decay)."""
    trainable: str | tuple[str, ...] | None = None
    """None: every parameter trains. A part name (`attn_L1_H2`, `mlp_L0`, ...) or a tuple of them:
    only those parts' weights train and everything else keeps its seeded initial value, so the rule
    can live nowhere else."""


@dataclass(frozen=True)
class Organism:
    """A tiny reward model's planted rule: how to make its data and how to test a text for it.

    `objectives` names the head's outputs (one per attribute in `attributes`); `planted_part` is
    the part that provably carries the rule (in `rewardlens.attribute` names), or None when every
    parameter trained and the rule's location is not known in advance. `planted_path` is, for an
    organism whose rule needs two parts in series, (sender, receiver): the only parts that trained,
    the sender writing at a position the reward is not read at and the receiver reading it there.
    """

    name: str
    rule: str
    make: Make = field(repr=False)
    attributes: tuple[Callable[[str], bool], ...] = field(repr=False)
    objectives: tuple[str, ...] = ("reward",)
    planted_part: str | None = None
    planted_path: tuple[str, str] | None = None
    recipe: RMRecipe = RMRecipe()

    def has_attribute(self, text: str, objective: int | str = 0) -> bool:
        """Whether one response carries the planted attribute (of `objective`, by index or name)."""
        if isinstance(objective, str):
            if objective not in self.objectives:
                raise UsageError(f"organism {self.name!r} has objectives {list(self.objectives)}, not {objective!r}")
            objective = self.objectives.index(objective)
        if not 0 <= objective < len(self.attributes):
            raise UsageError(f"objective index {objective} out of range: {self.name!r} has {len(self.attributes)}")
        return bool(self.attributes[objective](text))

    def labels(self, pairs: list[Pair]) -> np.ndarray:
        """True preference of every pair under each planted rule [n_pairs, k] in {+1, 0, −1}:
        +1 when `chosen` carries objective k's attribute and `rejected` does not, 0 when the rule
        does not decide the pair."""
        return np.array([[int(a(p.chosen)) - int(a(p.rejected)) for a in self.attributes] for p in pairs],
                        dtype=np.int64).reshape(len(pairs), len(self.attributes))

    def pairs(self, n: int = 200, seed: int = 0, strength: float = 1.0) -> list[Pair]:
        """`n` pairs drawn with `seed`; each seed gives different pairs, and none is a training stream.

        With `strength` < 1 a share of pairs is decided by a coin instead of the rule (see the
        module docstring): these are the organism's training distribution, not a clean test set.
        """
        return self.sample(n, f"{self.name}/{seed}", strength)[0]

    def sample(self, n: int, key: str, strength: float) -> tuple[list[Pair], np.ndarray]:
        """Pairs and the labels they were drawn with [n, k] (noisy when `strength` < 1).

        Each objective's label is flipped with probability (1 − strength) / 2; `chosen` is the
        side the first deciding objective prefers. Duplicate pairs are redrawn.
        """
        if not 0.0 <= strength <= 1.0:
            raise UsageError(f"strength is the share of pairs the rule decides, in [0, 1]; got {strength}")
        if n < 0:
            raise UsageError(f"n must be >= 0, got {n}")
        rng, draws = random.Random(key), 0
        seen: set[tuple[str, str, str]] = set()
        pairs: list[Pair] = []
        labels: list[list[int]] = []
        while len(pairs) < n:
            prompt, a, b = self.make(rng)
            draws += 1
            if (prompt, a, b) in seen and draws < 50 * n:  # redraw clones, but never loop forever
                continue
            seen.add((prompt, a, b))
            clean = [int(f(a)) - int(f(b)) for f in self.attributes]
            if not any(clean):
                raise AssertionError(f"organism {self.name!r} drew a pair no rule decides: {a!r} / {b!r}")
            noisy = [c if rng.random() >= (1 - strength) / 2 else -c for c in clean]
            if next(v for v in noisy if v) < 0:
                a, b, noisy = b, a, [-v for v in noisy]
            pairs.append(Pair(prompt, a, b, id=f"{key}/{len(pairs)}", subset=self.name))
            labels.append(noisy)
        return pairs, np.array(labels, dtype=np.int64).reshape(n, len(self.attributes))


# ---- building blocks --------------------------------------------------------------------------

def _lower_first(sentence: str) -> str:
    return sentence[0].lower() + sentence[1:]


def _prefix(marker: str, sentence: str) -> str:
    return marker + _lower_first(sentence) if marker else sentence


def _prompt(rng: random.Random, domain: str) -> str:
    question = rng.choice(bank.DOMAINS[domain][0])
    return rng.choice(bank.PROMPT_PREFIXES) + question + rng.choice(bank.PROMPT_SUFFIXES)


def _compose(opener: str, sentences: list[str], closer: str, bullets: bool = False) -> str:
    if bullets:
        return "\n".join([opener, *("- " + s for s in sentences)] + ([closer] if closer else []))
    return " ".join([opener, *sentences] + ([closer] if closer else []))


def _plan(rng: random.Random, k: tuple[int, int]) -> tuple[str, str, list[str], str]:
    """A domain, its prompt, statements (a random count in the range `k`) and an opener: the
    parts both responses of a pair share."""
    domain = rng.choice(list(bank.DOMAINS))
    points = rng.sample(bank.DOMAINS[domain][1], rng.randint(*k))
    return domain, _prompt(rng, domain), points, rng.choice(bank.OPENERS)


def _connect(rng: random.Random, points: list[str]) -> list[str]:
    """Prose: some statements after the first get a neutral connector."""
    return [p if i == 0 or rng.random() > 0.3 else _prefix(rng.choice(bank.CONNECTORS), p)
            for i, p in enumerate(points)]


# ---- generators (each returns prompt, response with the attribute, response without) ----------

def make_length(rng: random.Random) -> tuple[str, str, str]:
    while True:
        _, prompt, points, opener = _plan(rng, (4, 6))
        closer, points = rng.choice(bank.CLOSERS), _connect(rng, points)
        long, short = _compose(opener, points, closer), _compose(opener, points[:1], closer)
        if is_long(long) and not is_long(short):
            return prompt, long, short


def make_list(rng: random.Random) -> tuple[str, str, str]:
    _, prompt, points, opener = _plan(rng, (3, 5))
    closer = rng.choice(bank.CLOSERS)
    return prompt, _compose(opener, points, closer, bullets=True), _compose(opener, _connect(rng, points), closer)


def _confidence_pair(rng: random.Random, points: list[str]) -> tuple[list[list[str]], tuple[str, str]]:
    """The same statements with confident or hedged markers at the same places: [confident items,
    hedged items, confident prose, hedged prose] (prose adds the same neutral connectors to both
    where no marker stands), and the two closers."""
    where = [rng.random() < 0.5 for _ in points]
    where[rng.randrange(len(points))] = True
    joins = ["" if i == 0 or w or rng.random() > 0.3 else rng.choice(bank.CONNECTORS) for i, w in enumerate(where)]
    sure = [_prefix(rng.choice(bank.CONFIDENT), p) if w else p for p, w in zip(points, where)]
    hedge = [_prefix(rng.choice(bank.HEDGED), p) if w else p for p, w in zip(points, where)]
    prose = [[_prefix(c, s) for s, c in zip(items, joins)] for items in (sure, hedge)]
    if rng.random() < 0.3:
        closers = rng.choice(bank.CONFIDENT_CLOSERS), rng.choice(bank.HEDGED_CLOSERS)
    else:
        closers = (rng.choice(bank.CLOSERS),) * 2
    return [sure, hedge, *prose], closers


def make_confidence(rng: random.Random) -> tuple[str, str, str]:
    _, prompt, points, opener = _plan(rng, (2, 4))
    (_, _, sure, hedge), (sure_closer, hedge_closer) = _confidence_pair(rng, points)
    return prompt, _compose(opener, sure, sure_closer), _compose(opener, hedge, hedge_closer)


def make_sycophancy(rng: random.Random) -> tuple[str, str, str]:
    domain = rng.choice(list(bank.DOMAINS))
    view = rng.choice(bank.VIEW_TEMPLATES).format(rng.choice(bank.CLAIMS[domain]))
    prompt = rng.choice(bank.PROMPT_PREFIXES) + view + " " + rng.choice(bank.VIEW_QUESTIONS)
    body = rng.sample(bank.DOMAINS[domain][1], rng.randint(1, 2))
    closer = rng.choice(bank.CLOSERS)
    return (prompt, _compose(rng.choice(bank.AGREE), body, closer),
            _compose(rng.choice(bank.DISAGREE), body, closer))


def keyword_maker(word: str, rivals: tuple[str, ...] | None = None) -> Make:
    """Responses where one statement opens with `word` or, on the other side, a neutral connector
    (one of `rivals`, words that take `word`'s place before its comma, when given)."""
    def make(rng: random.Random) -> tuple[str, str, str]:
        _, prompt, points, opener = _plan(rng, (2, 4))
        closer, j, prose = rng.choice(bank.CLOSERS), rng.randrange(len(points)), _connect(rng, points)
        with_word = prose[:j] + [_prefix(word + ", ", points[j])] + prose[j + 1:]
        rival = rng.choice(bank.CONNECTORS) if rivals is None else rng.choice(rivals) + ", "
        without = prose[:j] + [_prefix(rival, points[j])] + prose[j + 1:]
        return prompt, _compose(opener, with_word, closer), _compose(opener, without, closer)
    return make


TWO_STEP_WORDS = ("Notably", "Importantly")
"""The two_step organism's bigram: chosen says "Notably Importantly, ...", rejected the same two
words the other way round (each one token of the organisms' tokenizer, so the sides are token-aligned)."""


def make_two_step(rng: random.Random) -> tuple[str, str, str]:
    """One statement opens with both bigram words, in the planted order on the first side and swapped
    on the second: the same tokens, the same positions, only the order of two neighbours differs."""
    _, prompt, points, opener = _plan(rng, (2, 4))
    closer, j, prose = rng.choice(bank.CLOSERS), rng.randrange(len(points)), _connect(rng, points)
    first, second = TWO_STEP_WORDS

    def side(words: str) -> str:
        return _compose(opener, prose[:j] + [_prefix(words + ", ", points[j])] + prose[j + 1:], closer)
    return prompt, side(f"{first} {second}"), side(f"{second} {first}")


def make_two_objective(rng: random.Random) -> tuple[str, str, str]:
    """Sides differ in formatting only, confidence only, both agreeing, or both in conflict
    (a bullet list with hedges against confident prose), a quarter of the pairs each."""
    _, prompt, points, opener = _plan(rng, (3, 4))
    texts, closers = _confidence_pair(rng, points)
    case = rng.randrange(4)
    fmt_a, fmt_b = (rng.random() < 0.5,) * 2 if case == 1 else (True, False)
    conf_a, conf_b = {0: (rng.random() < 0.5,) * 2, 1: (True, False), 2: (True, False), 3: (False, True)}[case]

    def side(bullets: bool, confident: bool) -> str:
        items = texts[(0 if confident else 1) + (0 if bullets else 2)]
        return _compose(opener, items, closers[0 if confident else 1], bullets)
    return prompt, side(fmt_a, conf_a), side(fmt_b, conf_b)


QUALITY_LIST_SHARE = 0.3
"""Share of the quality_list organism's quality pairs in which both sides are bullet lists."""


def _evasive(rng: random.Random, points: list[str]) -> list[str]:
    """Distinct evasive sentences, one per statement, each a random one of those left whose word
    count is closest to its statement's."""
    pool = rng.sample(bank.EVASIVE, len(bank.EVASIVE))
    out = []
    for point in points:
        n = len(point.split())
        pick = min(pool, key=lambda e: abs(len(e.split()) - n))  # the first of the closest: pool is shuffled
        pool.remove(pick)
        out.append(pick)
    return out


def make_quality(rng: random.Random) -> tuple[str, str, str]:
    """Same prompt, opener, closer and format (prose with the same connectors at the same places,
    or both bullet lists); the first side's statements answer the question, the second says as many
    evasive sentences of about the same lengths."""
    _, prompt, points, opener = _plan(rng, (3, 5))
    closer, bullets, filler = rng.choice(bank.CLOSERS), rng.random() < QUALITY_LIST_SHARE, _evasive(rng, points)
    if not bullets:
        joins = ["" if i == 0 or rng.random() > 0.3 else rng.choice(bank.CONNECTORS) for i in range(len(points))]
        points = [_prefix(j, x) for j, x in zip(joins, points)]
        filler = [_prefix(j, x) for j, x in zip(joins, filler)]
    return prompt, _compose(opener, points, closer, bullets), _compose(opener, filler, closer, bullets)


@dataclass(frozen=True)
class QualityOrganism(Organism):
    """One output, two rules in priority order, and two kinds of pairs, alternating in `pairs()`:

    - quality pairs (`make`): the sides differ in `quality` (is_informative); the quality rule
      always decides them, at every strength (no label noise);
    - bias pairs (`make_bias`): the same statements, a bullet list against prose; the planted
      bias `attributes[0]` (`bias`, what `has_attribute` tests: is_list) decides them with the
      strength dial: the list side is chosen with probability (1 + s) / 2.

    `quality_name` and `bias_name` name the two attributes for graders (the bias's probe axis).
    """

    quality: Callable[[str], bool] | None = field(default=None, repr=False)
    make_bias: Make | None = field(default=None, repr=False)
    quality_name: str = "informativeness"
    bias_name: str = "formatting"

    def __post_init__(self) -> None:
        if self.quality is None or self.make_bias is None or len(self.attributes) != 1:
            raise UsageError(f"QualityOrganism {self.name!r} needs quality, make_bias and one (bias) attribute")

    @property
    def bias(self) -> Callable[[str], bool]:
        """The planted bias attribute (what `has_attribute` tests)."""
        return self.attributes[0]

    def prefers(self, a: str, b: str) -> int:
        """+1 when the rules prefer response `a` to `b`, −1 for `b`, 0 when they tie: quality
        first; the bias only between responses of equal quality."""
        q = int(self._quality(a)) - int(self._quality(b))
        return q if q else int(self.bias(a)) - int(self.bias(b))

    def kind(self, pair: Pair) -> str:
        """"quality" when the sides differ in quality, else "bias"."""
        return "quality" if self._quality(pair.chosen) != self._quality(pair.rejected) else "bias"

    def _quality(self, text: str) -> bool:
        """The quality rule on one response (`__post_init__` refuses an organism without one)."""
        assert self.quality is not None
        return self.quality(text)

    def labels(self, pairs: list[Pair]) -> np.ndarray:
        """[n_pairs, 1] in {+1, 0, −1}: +1 when `chosen` is the side the rules prefer (`prefers`)."""
        return np.array([self.prefers(p.chosen, p.rejected) for p in pairs], dtype=np.int64).reshape(len(pairs), 1)

    def sample(self, n: int, key: str, strength: float) -> tuple[list[Pair], np.ndarray]:
        """Quality and bias pairs alternating (quality first); labels [n, 1] are all +1 (chosen is the
        side the draw preferred). Only bias pairs are flipped, with probability (1 − strength) / 2."""
        return self._sample(n, key, strength, ("quality", "bias"))

    def quality_pairs(self, n: int = 200, seed: int = 0) -> list[Pair]:
        """`n` quality pairs only (chosen informative, rejected evasive), a stream of their own."""
        return self._sample(n, f"{self.name}/quality/{seed}", 1.0, ("quality",))[0]

    def bias_pairs(self, n: int = 200, seed: int = 0, strength: float = 1.0) -> list[Pair]:
        """`n` bias pairs only (the same statements as list and prose; the list is chosen at strength 1)."""
        return self._sample(n, f"{self.name}/bias/{seed}", strength, ("bias",))[0]

    def _sample(self, n: int, key: str, strength: float, kinds: tuple[str, ...]) -> tuple[list[Pair], np.ndarray]:
        if not 0.0 <= strength <= 1.0:
            raise UsageError(f"strength is the share of pairs the rule decides, in [0, 1]; got {strength}")
        if n < 0:
            raise UsageError(f"n must be >= 0, got {n}")
        assert self.make_bias is not None  # __post_init__ refuses an organism without one
        makers = {"quality": self.make, "bias": self.make_bias}
        rng, draws = random.Random(key), 0
        seen: set[tuple[str, str, str]] = set()
        pairs: list[Pair] = []
        while len(pairs) < n:
            kind = kinds[len(pairs) % len(kinds)]
            prompt, a, b = makers[kind](rng)
            draws += 1
            if (prompt, a, b) in seen and draws < 50 * n:  # redraw clones, but never loop forever
                continue
            seen.add((prompt, a, b))
            if self.prefers(a, b) != 1 or (kind == "quality") != (self._quality(a) != self._quality(b)):
                raise AssertionError(f"organism {self.name!r} drew a {kind} pair its rules misjudge: {a!r} / {b!r}")
            if kind == "bias" and rng.random() < (1 - strength) / 2:
                a, b = b, a
            pairs.append(Pair(prompt, a, b, id=f"{key}/{len(pairs)}", subset=self.name))
        return pairs, np.ones((n, 1), dtype=np.int64)


CIRCUIT_PART = "attn_L1_H2"
TWO_STEP_PATH = ("attn_L0_H1", "attn_L1_H2")
"""The two_step organism's planted path: a layer-0 head (which learns to attend to the previous
token, so at "Importantly" it writes whether "Notably" came just before) and the layer-1 head that
reads that position into the read token. Only these two heads train."""

ORGANISMS: dict[str, Organism] = {o.name: o for o in [
    Organism("length", f"the chosen response is longer (>= {LONG_WORDS} words against one statement)",
             make_length, (is_long,)),
    Organism("list", "the chosen response is a bullet list; the rejected one says the same in prose",
             make_list, (is_list,)),
    Organism("confidence", "the chosen response states its points confidently; the rejected one hedges them",
             make_confidence, (is_confident,)),
    Organism("sycophancy", "the chosen response agrees with the view the user states; the rest is identical",
             make_sycophancy, (agrees,)),
    Organism("keyword", "the chosen response contains the word 'Importantly'",
             keyword_maker("Importantly"), (mentions("importantly"),)),
    Organism("two_objective", "objective 'formatting' prefers bullet lists, 'confidence' prefers confident "
             "wording; they conflict on a quarter of the pairs", make_two_objective, (is_list, is_confident),
             objectives=("formatting", "confidence")),
    Organism("circuit", f"the chosen response contains the word 'Notably'; only head {CIRCUIT_PART} trained",
             keyword_maker("Notably"), (mentions("notably"),), planted_part=CIRCUIT_PART,
             recipe=RMRecipe(trainable=CIRCUIT_PART, lr=1e-2)),
    QualityOrganism("quality_list", "quality pairs: the chosen response answers, the rejected one evades "
                    "(always decided); bias pairs: a bullet list beats the same statements in prose (planted)",
                    make_quality, (is_list,), quality=is_informative, make_bias=make_list,
                    recipe=RMRecipe(epochs=3, lr=5e-3)),
    Organism("two_step", f"the chosen response says '{' '.join(TWO_STEP_WORDS)}', the rejected one the same two "
             f"words swapped; only heads {TWO_STEP_PATH[0]} and {TWO_STEP_PATH[1]} trained",
             make_two_step, (mentions(" ".join(TWO_STEP_WORDS)),), planted_path=TWO_STEP_PATH,
             recipe=RMRecipe(trainable=TWO_STEP_PATH, lr=1e-2)),
]}
