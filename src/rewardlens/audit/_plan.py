"""What one audit run computes (`Plan`), and the fixed chunks every run and every rank cuts the pairs into."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..causal import Circuit, Faithfulness, Patching, PatchSpec, patch_mode
from ..causal.internal import aligned, encode_pairs
from ..data import Pair
from ..data.internal import rows_of
from ..errors import UsageError
from ..exact import Attribution, Lens, Steps, TokenAttribution
from ..exact.internal import STEP_FIELDS
from ..hacking import ITEMS, STAGES, Concepts, Conflicts, Item, Probes, spread_items
from ..model import RewardModel
from ..model.internal import Tokenized
from ..sae import FeatureAttribution
from ..types import Mode, Positions
from ._keys import RunKey, content_key, fingerprint, schema_version

REVISION = 2
"""Bump when a stored number would change with no stored field changing (a fix to how one is computed).
2: per-pair units are named by the pair's content (`content_key`), not its index, and a pair's steps are
numbered by side (0 chosen, 1 rejected), not by input row."""
STORED_RESULTS: tuple[type, ...] = (Lens, Attribution, Faithfulness, Steps, Probes, Concepts, FeatureAttribution,
                                    Conflicts, Patching, TokenAttribution, Circuit)
"""Every result the audit keeps in its store: per pair (by their `STORED` declaration) or whole."""
VERSION = schema_version(REVISION, STORED_RESULTS, STEP_FIELDS)
"""Version of every audit instrument's stored numbers, derived from the stored results' fields."""


@dataclass(frozen=True)
class Plan:
    """What one audit run computes; the same plan over the same model and pairs finds the same store rows."""

    chunk_size: int = 8
    """Pairs per chunk: the unit of writing, resuming and sharding."""
    batch_size: int = 8
    """Sequences per forward inside a chunk."""
    probes: bool = True
    """Run the hacking probes on the built-in items (the floor's scale the items' reward sd, each flag checked
    under the pairs' mean |margin|: fragile where it differs)."""
    concepts: bool = True
    """Run the concept directions and dose-response on the probe axes' contrast sets."""
    probe_items: int | None = None
    """The built-in items of probes and concepts. None: as many as the intervals need, in the stages
    `STAGES` (18, 36, 72 items, spread over the domains): the probes stop at the first stage where every
    axis is decided and the concepts use that stage's items (docs/probes.md); a number: that many
    (spread over the domains), a fixed budget, `len(ITEMS)` (72) for the full set (the default before stages)."""
    sae_layer: int | None = None
    """Residual layer of the SAE, when one is given."""
    fraction: float = 0.5
    """Crystallization threshold the report uses."""
    divergence: bool = True
    """Score the read-position head patching of every pair for out-of-distribution patched states
    (faithfulness's own sweep, scored against a natural fit over every pair made before the chunks: one
    head-less forward of every pair; needs 4 pairs)."""
    tokens: bool = True
    """Exact token attribution of the pairs the report shows (at most 12, by |margin|): two more
    forwards of those pairs, whatever the number of pairs."""
    paper: bool = False
    """Also compute the seed paper's statistic its own way (prefix noising over attention and MLP
    sublayers, `faithfulness(paper=True)`): one more patched forward of the chosen sides per sublayer."""
    circuit: bool = False
    """Find and evaluate the circuit of the top sublayer edges (`rl.circuit`, EAP-IG): costly, so off by default."""
    graph: bool = False
    """Build the margin attribution graphs of the first pairs the report shows (`audit/_graph.py`: over the
    transcoders `audit(transcoders=)` gives, else the MLPs' own neurons on a small model): costly, so off by default."""

    def __post_init__(self) -> None:
        if self.chunk_size < 1 or self.batch_size < 1:
            raise UsageError(f"chunk_size and batch_size must be >= 1, got {self.chunk_size} and {self.batch_size}")
        if not 0 < self.fraction <= 1:
            raise UsageError(f"fraction must be in (0, 1], got {self.fraction}", option="fraction")
        n = self.probe_items
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 2 <= n <= len(ITEMS)):
            raise UsageError(f"probe_items must be an int between 2 (concepts need two inputs a side) and {len(ITEMS)} "
                             f"(all the built-in items), or None for the staged budget, got {n!r}",
                             option="probe_items")

    def for_reads(self) -> Plan:
        """This plan for a reward read at a set of positions: without the steps that read one token per
        sequence (probes, concepts, divergence, tokens, the paper's prefix statistic, the circuit, the graphs)."""
        return replace(self, probes=False, concepts=False, divergence=False, tokens=False, paper=False, circuit=False,
                       graph=False)

    def items(self) -> list[Item] | None:
        """The built-in items the probes use (None: all of them, in stages under the default budget)."""
        return None if self.probe_items is None else spread_items(self.probe_items)

    def stages(self) -> tuple[int, ...] | None:
        """The probes' stages (`probe(stages=)`): `STAGES` under the default budget, else None (one item set)."""
        return STAGES if self.probe_items is None else None

    def concept_items(self, probes: Mapping[str, Any] | None) -> list[Item] | None:
        """The built-in items the concepts use: the probes' under a fixed budget; under the staged one, those of
        the stage the probes stopped at (`probes`: their stored record), or all when none is stored."""
        if self.probe_items is not None or probes is None:
            return self.items()
        return spread_items(int(probes["stages"][int(probes["stage"]) - 1]))

    def suffix(self) -> str:
        return "" if self.probe_items is None else f"/items-{self.probe_items}"

    def probes_name(self) -> str:
        """The probes' name in the store (`whole_key`): it names a fixed item budget."""
        return "probes" + self.suffix()

    def concepts_name(self, probes: Mapping[str, Any] | None) -> str:
        """The concepts' name in the store: it names their item set (`concept_items`: under the staged budget,
        that of the stage the stored probes stopped at, `probes`; all items when none is stored), so concepts
        run on another set (another stage, or before any probes were stored) are never read back as these."""
        if self.probe_items is not None:
            return "concepts" + self.suffix()
        items = self.concept_items(probes)
        return "concepts/" + ("all-items" if items is None else f"stage-items-{len(items)}")


def chunks(n_pairs: int, chunk_size: int) -> list[range]:
    """The fixed chunks of pair indices every run (and every rank) cuts the pairs into."""
    return [range(s, min(s + chunk_size, n_pairs)) for s in range(0, n_pairs, chunk_size)]


@dataclass(frozen=True)
class PairUnits:
    """Each pair's store unit (`content_key`), and the distinct units in first-occurrence order with the first
    pair holding each. A pair given twice is one unit: computed once, read back for both places."""

    units: tuple[str, ...]
    """The unit of pair i, for every pair in order."""
    first: Mapping[str, int]
    """Each distinct unit → the first pair holding it, in first-occurrence order."""

    @classmethod
    def of(cls, pairs: Sequence[Pair]) -> PairUnits:
        """The units of `pairs`, in their order."""
        units = tuple(content_key(p) for p in pairs)
        first: dict[str, int] = {}
        for i, unit in enumerate(units):
            first.setdefault(unit, i)
        return cls(units, first)

    def spans(self, chunk_size: int) -> list[list[str]]:
        """The fixed chunks of distinct units every run and every rank cuts them into: the first unit alone, then
        `chunks` of `chunk_size` over the others. A function of the pairs alone, never of what a store holds, so
        ranks that see different shards still split the units the same way and no unit is computed by two ranks.
        The first pair alone tells the progress bar what a pair costs before the first full chunk runs."""
        order = list(self.first)
        rest = [range(span.start + 1, span.stop + 1) for span in chunks(len(order) - 1, chunk_size)]
        return [[order[i] for i in span] for span in [range(min(1, len(order))), *rest] if len(span)]


LENS = "lens"
"""The lens's instrument name in the store (`run_keys`, `lens_key`)."""


@dataclass(frozen=True)
class Decided:
    """What a run decides once, from all its pairs, before any chunk, so every chunk and every rank
    computes the same thing: how faithfulness patches. It carries the token ids the decision read,
    which every chunk traces from: a run tokenizes each pair once."""

    seed_positions: Positions
    """Whole-sequence ('all', every pair token-aligned) or read-position ('read') seed statistic."""
    mode: Mode
    """Noising, or zero ablation where a set of reads has no read-to-read map (`patch_mode`)."""
    seqs: list[Tokenized] = field(default_factory=list, compare=False, repr=False)
    """Every pair's token ids (`encode_pairs`), chosen and rejected interleaved."""

    @classmethod
    def of(cls, model: RewardModel, pairs: Sequence[Pair]) -> Decided:
        """Decide for `pairs`, tokenizing them once."""
        seqs = encode_pairs(model, pairs)
        return cls("all" if aligned(model, pairs, seqs) else "read", patch_mode(model, pairs, seqs), seqs)

    @property
    def spec(self) -> PatchSpec:
        """How the audit's faithfulness patches its total and direct effects: heads, read positions, `mode`."""
        return PatchSpec(mode=self.mode, level="head")

    def seqs_of(self, span: Sequence[int]) -> list[Tokenized] | None:
        """The token ids of the pairs `span` (indices into the run's pairs), both sides in pair order."""
        if not self.seqs:
            return None
        return [self.seqs[row] for i in span for row in rows_of(i)]


BY_CONTENT = "pairs-by-content"
"""The `data` of every per-pair run key: its units are pairs named by their content (`content_key`), so one
run holds the pairs of every pair set audited with the model and a pair is found whatever set it comes in.
The whole-model runs keep the checksum of the pair set (`whole_key`): their numbers depend on all pairs."""


def lens_key(model: RewardModel) -> RunKey:
    """The store key of the lens, `run_keys(...)["lens"]` without the run's decisions (the lens is the same
    whatever faithfulness does, so finding it needs no tokenization)."""
    return RunKey(fingerprint(model), BY_CONTENT, LENS, VERSION)


def run_keys(model: RewardModel, pairs: Sequence[Pair], plan: Plan, decided: Decided | None = None
             ) -> dict[str, RunKey]:
    """The store key of each per-pair instrument (`lens`, `sublayers`, `heads`, `faithfulness`, and `steps` for
    a reward read at a set of positions) for this run; `decided`: the run's decisions when already made.

    No key depends on the pair set (`BY_CONTENT`), except through faithfulness's decision over all pairs
    (seed positions, patching mode): a subset whose decision differs patches differently, so its
    faithfulness is another run and is computed again, while its lens and attribution are reused."""
    fp, data = fingerprint(model), BY_CONTENT
    decided = Decided.of(model, pairs) if decided is None else decided
    names = {"lens": LENS, "sublayers": "attribution/sublayer", "heads": "attribution/head",
             "faithfulness": f"faithfulness/{decided.spec.name}/seed-{decided.seed_positions}"
                             + ("/paper" if plan.paper else "")}
    if model.reads.multi:  # every read's own score, for where the preference forms
        names["steps"] = f"steps/{model.reads.at}/{model.reads.combine}"
    return {field: RunKey(fp, data, name, VERSION) for field, name in names.items()}


def skipped_key(model: RewardModel) -> RunKey:
    """The store key under which a run records the pairs it skipped (one unit per pair, by content, with the
    reason)."""
    return RunKey(fingerprint(model), BY_CONTENT, "skipped", VERSION)
