"""The README's "## Use" block runs as written, so the README cannot drift from the API.

Every statement of the block runs, in order and in one namespace, on the built-in demo model and
its audit pairs. Only the paths are swapped for real ones under tmp_path, and the names the block
leaves to the reader (`with_lists`, `multi_objective_model`, `model_a`, `hf_model`, ...) are defined
in a prelude. Each expression statement's value is kept, so the checks below read what the README's
own lines returned.
"""

import ast
import re
from pathlib import Path

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.data import save_pairs
from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir
from rewardlens.zoo.organisms import build

README = Path(__file__).resolve().parents[1] / "README.md"

PRELUDE = """
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from rewardlens.hacking import contrast_sets

with_lists, without_lists = contrast_sets("formatting")      # bullet lists vs the same points as prose
multi_objective_model = rl.load(two_objective, readout=0)    # two objectives: formatting, confidence
model_a, model_b = demo, list_organism                        # folders, as compare accepts them
hf_model = AutoModelForSequenceClassification.from_pretrained(demo).eval()
tokenizer = AutoTokenizer.from_pretrained(demo)
"""


def use_block() -> tuple[str, int]:
    """The Python code of the README's "## Use" section and the README line it starts on."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Use\n")
    section = text[start:text.index("\n## ", start + 1)]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "the README's Use section has no ```python block"
    block = found.group(1)
    assert block.startswith("import rewardlens as rl\n")
    first_line = text[:start + found.start(1)].count("\n") + 1
    return block, first_line


def swap_paths(block: str, paths: dict[str, str]) -> str:
    """Replace each README placeholder path by a real one; each must occur exactly once."""
    for old, new in paths.items():
        assert block.count(old) == 1, f"the README's Use block no longer contains {old!r} exactly once"
        block = block.replace(old, new)
    return block


def run(block: str, first_line: int, ns: dict) -> list[tuple[str, object]]:
    """Execute `block` statement by statement in `ns`; return (source, value) of each expression statement.

    Tracebacks point at README.md's own line numbers."""
    tree = ast.parse(block)
    ast.increment_lineno(tree, first_line - 1)
    values = []
    for node in tree.body:
        source = ast.unparse(node)
        if isinstance(node, ast.Expr):
            code = compile(ast.Expression(node.value), str(README), "eval")
            values.append((source, eval(code, ns)))
        else:
            exec(compile(ast.Module([node], type_ignores=[]), str(README), "exec"), ns)
    return values


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme")
    save_pairs(AUDIT_PAIRS, tmp / "pairs.jsonl")
    block, first_line = use_block()
    block = swap_paths(block, {
        'rl.load("path/to/reward-model")': f"rl.load({str(demo_model_dir())!r})",
        'rl.load_pairs("pairs.jsonl")': f"rl.load_pairs({str(tmp / 'pairs.jsonl')!r})",
        'store="audit/results.sqlite"': f"store={str(tmp / 'audit' / 'results.sqlite')!r}",
        'out="edited/"': f"out={str(tmp / 'edited')!r}",
    })
    ns = {"rl": rl, "demo": str(demo_model_dir()), "two_objective": str(build("two_objective")),
          "list_organism": str(build("list"))}
    exec(PRELUDE, ns)
    values = run(block, first_line, ns)
    return ns, values, tmp


def value_of(values: list[tuple[str, object]], prefix: str) -> object:
    (value,) = [v for source, v in values if source.startswith(prefix)]
    return value


def test_every_line_of_the_use_block_runs(readme):
    ns, values, tmp = readme
    for name in ("model", "pairs", "att", "ln", "pt", "pr", "cv", "result", "mon"):
        assert name in ns, f"the README's Use block no longer defines {name!r}"
    assert len(values) >= 15  # every bare expression ran and returned
    assert len(ns["pairs"]) == len(AUDIT_PAIRS)
    assert (tmp / "audit" / "results.sqlite").is_file()


def test_scores_and_attribution_close_as_the_comments_say(readme):
    ns, values, _ = readme
    model, pairs, att = ns["model"], ns["pairs"], ns["att"]
    scores = value_of(values, "model.score(pairs)")
    assert scores.shape == (2 * len(pairs),)
    np.testing.assert_allclose(att.reward, scores, atol=1e-5)
    np.testing.assert_allclose(att.values.sum(1) + att.constant, att.reward, atol=1e-4)
    assert att.margin.shape == (len(pairs), att.values.shape[1])
    np.testing.assert_allclose(att.margin, att.values[0::2] - att.values[1::2], atol=1e-6)
    # the commented alternatives: wrap a model already loaded; build the pairs by hand
    np.testing.assert_allclose(rl.wrap(ns["hf_model"], ns["tokenizer"]).score(pairs), scores, atol=1e-5)
    by_hand = [rl.Pair(prompt=p.prompt, chosen=p.chosen, rejected=p.rejected) for p in pairs]
    np.testing.assert_allclose(model.score(by_hand), scores, atol=1e-6)


def test_lens_ends_at_the_reward_and_patch_effects_are_per_pair(readme):
    ns, values, _ = readme
    model, pairs, ln, pt = ns["model"], ns["pairs"], ns["ln"], ns["pt"]
    scores = value_of(values, "model.score(pairs)")
    assert ln.linear.shape == ln.normed.shape == (2 * len(pairs), model.n_layers + 1)
    np.testing.assert_allclose(ln.linear[:, -1], scores, atol=1e-4)
    np.testing.assert_allclose(ln.normed[:, -1], scores, atol=1e-4)
    depth = value_of(values, "ln.crystallization(")
    assert len(depth) == len(pairs) and np.all((depth[~np.isnan(depth)] >= 0) & (depth[~np.isnan(depth)] <= 1))
    assert pt.effect.shape[0] == len(pairs)


def test_hacking_lines_return_their_results(readme):
    ns, values, tmp = readme
    frame = value_of(values, "pr.to_frame()")
    assert len(frame) > 0
    assert ns["cv"].names == ("lists",)
    conflict = value_of(values, "rl.hacking.conflict(")
    assert conflict.names == ["formatting", "confidence"] and conflict.n_pairs == len(ns["pairs"])
    edited = value_of(values, "rl.edit(")
    assert edited.path is not None and Path(edited.path) == tmp / "edited"
    reloaded = rl.load(str(tmp / "edited"))
    np.testing.assert_allclose(reloaded.score(ns["pairs"]), edited.model.score(ns["pairs"]), atol=1e-5)


def test_audit_compare_and_monitor(readme):
    ns, values, _ = readme
    result, pairs = ns["result"], ns["pairs"]
    np.testing.assert_allclose(result.sublayers.reward, value_of(values, "model.score(pairs)"), atol=1e-5)
    assert len(result.pair_ids) == len(pairs)
    comparison = value_of(values, "compare(")
    assert comparison.pair_ids == result.pair_ids
    # the comment's call: the monitor measures a Hugging Face model at a step that is a multiple of `every`
    mon = ns["mon"]
    assert mon(ns["hf_model"], ns["tokenizer"], 49) is None
    snap = mon(ns["hf_model"], ns["tokenizer"], 50)
    assert snap.step == 50
    np.testing.assert_allclose(snap.rewards, value_of(values, "model.score(pairs)"), atol=1e-4)
