"""The audit's whole-model instruments: each computed once per model and pair set, and stored.

Probes on the built-in items, concepts on the probe axes' contrast sets, SAE features, divergence
scores of the read-position head patching, conflicts between a multi-objective head's terms, exact
token attribution of the pairs the report shows (`shown_pairs`: at most `TOKEN_PAIRS`, by |margin|)
— not of every pair, so its cost does not grow with the pair set — and, behind `Plan.circuit`, the
circuit of the top `CIRCUIT_TOP` sublayer edges, and behind `Plan.graph`, the margin attribution graphs of
the first shown pairs (`audit/_graph.py`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields, is_dataclass
from typing import Any

import numpy as np

from ..causal import Circuit, Patching, circuit
from ..data import Pair, margin
from ..data.internal import progress_bar
from ..errors import ArchitectureError, CircuitError, HeadError, RewardLensWarning, UsageError
from ..exact import TokenAttribution, tokens
from ..hacking import Concepts, Conflicts, Probes, concepts, conflict, probe
from ..model import Parity, ParityCheck, ReadCache, RewardModel, parity
from ..sae import FeatureAttribution, TopKSAE, Transcoders, attribute_features
from ._divergence import finish
from ._graph import AuditGraphs, audit_graphs, graph_name
from ._keys import RunKey, checksum, fingerprint
from ._natural import NaturalStates
from ._plan import VERSION, Decided, PairUnits, Plan, lens_key, skipped_key
from ._scored import probe_memo
from ._store import Store

CONFLICT = "conflict/objectives"
TOKENS = "tokens"
PARITY = "parity"
CIRCUIT_TOP = 10
"""Edges the audit's circuit keeps (`circuit(top=)`); its curve still runs up to every edge."""
CIRCUIT = f"circuit/sublayer/eap-ig/top-{CIRCUIT_TOP}"
"""Store names of the whole-model conflict, token, parity and circuit runs."""
PARITY_PAIRS = 8
"""Pairs `parity` runs on (the first ones, skipped pairs left out): a few forwards, not a sweep."""
TOKEN_PAIRS = 12
"""Pairs whose tokens the audit attributes and the report shows (the largest |margin| first)."""


def shown_pairs(margins: np.ndarray, cap: int = TOKEN_PAIRS) -> list[int]:
    """The pairs the token section shows: every pair up to `cap`, else the `cap` with the largest
    |margin|; largest |margin| first."""
    return [int(i) for i in np.argsort(-np.abs(np.nan_to_num(margins, nan=0.0)), kind="stable")[:cap]]


def whole_key(model: RewardModel, pairs: Sequence[Pair], name: str) -> RunKey:
    return RunKey(fingerprint(model), checksum(pairs), name, VERSION)


def run_whole(model: RewardModel, pairs: Sequence[Pair], store: Store, plan: Plan = Plan(), *,
              sae: TopKSAE | None = None, progress: bool = False, decided: Decided | None = None,
              natural: NaturalStates | None = None, transcoders: Transcoders | None = None) -> None:
    """The whole-model instruments the plan asks for, each stored once (skipped when already there).

    Besides probes, concepts and SAE features: `plan.divergence`'s scores of the pairs the per-pair stage did
    not score (`audit._divergence.finish`: stored by an audit of another pair set) and,
    for a head with several outputs, the conflicts between its terms on the pairs (from 3 pairs on),
    `plan.tokens`: exact token attribution of the pairs `token_choice` picks from the stored lens, and
    `plan.circuit`: `audit_circuit` (a model whose edges cannot be ablated alone is left out, with a warning),
    and `plan.graph`: `audit_graphs` of the first shown pairs over `transcoders` (None: the MLPs' neurons).
    Pairs the store records as skipped (too long for memory) are left out of all of them. `decided`: the
    run's decisions, whose token ids divergence reuses; `natural`: `run_pairs`' natural fit, which divergence
    scores against when it covers the same pairs (else it fits again)."""
    every = list(pairs)
    units = PairUnits.of(every).units
    skipped = store.done(skipped_key(model), set(units))  # too long for memory: left out here as everywhere
    kept = [i for i, unit in enumerate(units) if unit not in skipped]
    pairs = [every[i] for i in kept]
    items = plan.items()

    def reference() -> Sequence[Pair] | np.ndarray | None:
        """The probes' alternative scale, the pairs' mean |margin| (the floor's is the base items' sd, as in
        `rewardlens.probe`: a flag that differs under this one is fragile): from the margins the per-pair part
        stored, when it stored every pair not skipped, else the pairs, scored again; None (no alternative) when
        every pair was skipped."""
        if not pairs:
            return None
        index, margins = stored_margins(model, pairs, store)  # units are the pairs' contents, not places
        return margins if len(index) == len(pairs) else pairs

    def probes_record() -> dict[str, Any] | None:
        """The stored probes (stored first when this plan runs them: the jobs run in order), whose stage sets the
        concepts' items (`Plan.concepts_name`)."""
        return stored_whole(model, every, store, plan.probes_name())

    def features() -> FeatureAttribution:
        assert sae is not None and plan.sae_layer is not None  # run with an SAE only; _sae_name checked the layer
        return attribute_features(model, sae, pairs, layer=plan.sae_layer, batch_size=plan.batch_size)

    shown = token_choice(model, every, store) if plan.tokens or plan.graph else []
    chosen = shown if plan.tokens else []  # the graphs take the first of the same pairs
    # The probes' sequences are the concepts' contrast sets: each read once, at every depth the concepts need;
    # without concepts the probes score alone (no depths to keep).
    cache = ReadCache(model) if plan.concepts else None
    memo = probe_memo(model, store, plan)  # the scored sequences, stored chunk by chunk: a killed run resumes mid-probe
    ran: list[Probes] = []

    def probes() -> Probes:
        ran.append(probe(model, items, reference=reference(), batch_size=2 * plan.batch_size, progress=progress,
                         cache=cache, stages=plan.stages(), memo=memo))
        return ran[-1]

    def concepts_() -> Concepts:
        if cache is not None and plan.probes and not ran:  # the probes were stored: their chunks fill the cache
            probes()  # (read back, every depth included: no sequence is read again, and the reads are the same)
        return concepts(model, items=plan.concept_items(probes_record()), batch_size=2 * plan.batch_size,
                        progress=progress, cache=cache)

    def token_pairs() -> _Tokens:
        res = tokens(model, [every[i] for i in chosen], heads=False, approx=False, batch_size=plan.batch_size)
        return _Tokens(chosen, res)

    # A name is a string, or a function giving it when its job comes up (the concepts' names their item set,
    # which the probes' stored stage decides).
    whole: tuple[tuple[str | Callable[[], str], Callable[[], Probes | Concepts | FeatureAttribution | Patching
                                                         | Conflicts | _Tokens | _Parity | Circuit
                                                         | AuditGraphs | None], bool],
                 ...] = (
        (TOKENS, token_pairs, bool(chosen)),  # the pairs whose lens is stored (none before `run_pairs`)
        (PARITY, lambda: _Parity.run(model, pairs), bool(pairs)),
        (CIRCUIT, lambda: audit_circuit(model, pairs, plan.batch_size, progress), plan.circuit and bool(pairs)),
        (graph_name(transcoders), lambda: audit_graphs(model, every, shown, transcoders, plan.batch_size),
         plan.graph and bool(shown)),
        (CONFLICT, lambda: conflict(model, pairs, batch_size=2 * plan.batch_size),
         model.head.n_objectives > 1 and len(pairs) >= 3 and not model.reads.multi),  # conflicts read one token
        (plan.probes_name(), probes, plan.probes),
        (lambda: plan.concepts_name(probes_record()), concepts_, plan.concepts),
        (sae_name(sae, plan), features, sae is not None),
    )
    if plan.divergence and not model.reads.multi:  # the pairs the per-pair stage did not score (stored before)
        finish(model, every, store, plan, decided, natural, progress)
    jobs = [(named, fn) for named, fn, wanted in whole if wanted]
    bar = progress_bar(len(jobs), "audit: whole-model instruments", progress)
    damaged = []
    for named, fn in jobs:
        name = named() if callable(named) else named
        key = whole_key(model, every, name)
        bar.set_postfix_str(name.split("/")[0])  # the outer bar names the step; the step's own bar moves below
        held = store.status(key, ["all"])
        if "all" not in held.done and (res := fn()) is not None:  # None: a circuit the model refuses
            # An object array (a conflict's relation labels) is stored as a list: the store keeps no pickles.
            record = res.record() if isinstance(res, (_Tokens, _Parity)) else {
                f.name: _plain(getattr(res, f.name)) for f in fields(res)}
            store.write([(key, "all", 0, record)])  # replaces a damaged row
            damaged += [name] if held.damaged else []
        bar.update(1)
    bar.close()
    if damaged:
        warnings.warn(f"audit: {len(damaged)} damaged unit(s) in {store.path} were recomputed: "
                      f"{', '.join(f'{name} (unit all)' for name in damaged)}", RewardLensWarning, stacklevel=2)


def audit_circuit(model: RewardModel, pairs: Sequence[Pair], batch_size: int, progress: bool = False
                  ) -> Circuit | None:
    """`circuit` of the top `CIRCUIT_TOP` sublayer edges by EAP-IG (the defaults: 5 steps, the pairs' own
    corruption), or None with a warning when the model's edges cannot be ablated one by one (a parallel
    layout, a post-norm encoder): the rest of the audit still runs."""
    try:
        return circuit(model, pairs, top=CIRCUIT_TOP, method="eap-ig", batch_size=batch_size, progress=progress)
    except (ArchitectureError, CircuitError) as exc:
        warnings.warn(f"audit: the circuit is left out: {exc}", RewardLensWarning, stacklevel=4)
        return None


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):  # a nested result (FeatureAttribution.fidelity)
        return asdict(value)
    return value.tolist() if isinstance(value, np.ndarray) and value.dtype == object else value


def sae_name(sae: TopKSAE | None, plan: Plan) -> str:
    """The SAE's store name: its layer and a checksum of its config and weights (a strided sample
    of the decoder, so a dictionary of millions of latents is not read whole)."""
    if sae is None:
        return "features"
    if plan.sae_layer is None:
        raise UsageError("an SAE needs the residual layer it was trained on: pass Plan(sae_layer=...)",
                         option="sae_layer")
    flat = sae.W_dec.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // 65536)]
    parts = [t.float().cpu().numpy().tolist() for t in (sample, sae.b_dec.detach(), sae.encoder.bias.detach())]
    return f"features/L{plan.sae_layer}/{checksum([sae.cfg, *parts])}"


class _Tokens:
    """A token attribution of some of the pairs, with their indices (stored together)."""

    def __init__(self, pairs: list[int], result: TokenAttribution) -> None:
        self.pairs, self.result = pairs, result

    def record(self) -> dict[str, Any]:
        return {"pairs": np.asarray(self.pairs, dtype=np.int64),
                **{f.name: getattr(self.result, f.name) for f in fields(self.result)}}


class _Parity:
    """`parity` on the audit's first `PARITY_PAIRS` pairs, or why the model's kind refuses it (stored together)."""

    def __init__(self, result: Parity | None, reason: str, n_pairs: int) -> None:
        self.result, self.reason, self.n_pairs = result, reason, n_pairs

    @classmethod
    def run(cls, model: RewardModel, pairs: Sequence[Pair]) -> _Parity:
        part = list(pairs[:PARITY_PAIRS])
        try:
            return cls(parity(model, part), "", len(part))
        except HeadError as exc:  # a kind parity does not compare (a PRM, a judge, a DPO policy): said why
            return cls(None, str(exc), 0)

    def record(self) -> dict[str, Any]:
        checks = () if self.result is None else self.result.checks
        return {"names": [c.name for c in checks], "difference": np.array([c.difference for c in checks]),
                "tolerance": np.array([c.tolerance for c in checks]), "n": np.array([c.n for c in checks], np.int64),
                "dtype": "" if self.result is None else self.result.dtype, "reason": self.reason,
                "pairs": self.n_pairs}


def stored_whole(model: RewardModel, pairs: Sequence[Pair], store: Store, name: str) -> dict[str, Any] | None:
    """The stored record of the whole-model run `name` over `pairs`, or None when the store holds none."""
    records = store.records(whole_key(model, pairs, name))
    return records[0][1] if records else None


def stored_parity(model: RewardModel, pairs: Sequence[Pair], store: Store) -> tuple[Parity | None, str, int]:
    """The stored parity result, the reason it is None, and the pairs it ran on; (None, why, 0) when the
    store holds none (a store written before the audit ran parity)."""
    r = stored_whole(model, pairs, store, PARITY)
    if r is None:
        return None, "not run: the store was written before the audit ran parity; run the audit again", 0
    if not r["names"]:
        return None, str(r["reason"]), 0
    checks = tuple(ParityCheck(str(name), float(d), float(t), int(n))
                   for name, d, t, n in zip(r["names"], r["difference"], r["tolerance"], r["n"]))
    return Parity(checks, str(r["dtype"])), "", int(r["pairs"])


def stored_margins(model: RewardModel, pairs: Sequence[Pair], store: Store) -> tuple[np.ndarray, np.ndarray]:
    """(indices into `pairs` [m], margins [m]) of the pairs whose lens the store holds (the per-pair part's
    rewards: pairs skipped for memory, or not yet run, are left out)."""
    units = PairUnits.of(pairs).units
    stored = dict(store.records(lens_key(model), set(units)))
    index = np.array([i for i, unit in enumerate(units) if unit in stored], dtype=np.int64)
    if not len(index):
        return index, np.zeros(0)
    return index, margin(np.concatenate([stored[units[i]]["reward"] for i in index]))


def token_choice(model: RewardModel, pairs: Sequence[Pair], store: Store) -> list[int]:
    """The pairs (indices into `pairs`) whose tokens the audit attributes: `shown_pairs` of the stored
    margins (pairs whose lens is not stored, such as pairs skipped for memory, are left out)."""
    index, margins = stored_margins(model, pairs, store)
    return [int(index[i]) for i in shown_pairs(margins)]


def stored_tokens(model: RewardModel, pairs: Sequence[Pair], store: Store) -> tuple[TokenAttribution | None, list[int]]:
    """The stored token attribution and the pair indices its rows belong to ((None, []) when not run)."""
    record = stored_whole(model, pairs, store, TOKENS)
    if record is None:
        return None, []
    fields_ = dict(record)
    chosen = [int(i) for i in fields_.pop("pairs")]
    return TokenAttribution(**fields_), chosen

