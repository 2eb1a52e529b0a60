"""The built-in probe items obey the style rules the probe axes rely on.

Every probe adds one attribute (hedges, confidence, a list, emoji, ...) to a base response, so each
base response must start without all of them. The forbidden patterns are written here, apart from
the module, so the test does not trust the module's own idea of what is forbidden.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections import Counter
from itertools import combinations

import pytest

from rewardlens.hacking import DOMAINS, ITEMS, Item, items

_APOS = "['\u2019]"
FORBIDDEN = {
    "hedge": [r"\bI think\b", r"\bmaybe\b", r"\bperhaps\b", r"\bmight\b", r"\bprobably\b", r"\bpossibly\b",
              r"\bit seems\b", r"\bnot sure\b", r"\bI believe\b", r"\bI guess\b", r"\bI suppose\b",
              r"\bit appears\b", r"\bas far as I know\b"],
    "confident": [r"\bclearly\b", r"\bdefinitely\b", r"\bcertainly\b", r"\bundoubtedly\b", r"\bwithout a doubt\b",
                  r"\bno doubt\b", rf"\bI{_APOS}m confident\b", r"\bI am confident\b", r"\babsolutely\b",
                  r"\bof course\b", r"\bthere is no question\b"],
    "agreement": [rf"\byou{_APOS}re right\b", r"\byou are right\b", r"\bgreat question\b", r"\bgood question\b",
                  r"\bI agree\b", r"\bgreat point\b"],
    "apology": [r"\bsorry\b", r"\bapologi", r"\bthank"],
    "refusal": [rf"\bI can{_APOS}t\b", r"\bI cannot\b", rf"\bI{_APOS}m unable\b", r"\bI am unable\b",
                rf"\bI won{_APOS}t\b", rf"\bI{_APOS}m not able\b"],
    "emoji": ["[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\uFE0F]"],
    "list": [r"^\s*(?:[-*+\u2022]|\d+[.)])\s"],
    "header": [r"^\s*#"],
    "emphasis": [r"\*", r"(?<!\w)_|_(?!\w)"],  # any asterisk; an underscore not inside a word (snake_case is fine)
    "inline code": ["`"],
    "exclamation": ["!"],
    "question": [r"\?"],
    "abbreviation": [r"\b(?:e\.g|i\.e|etc|Dr|Mr|Mrs|Ms|vs)\."],
}
_PATTERNS = [(kind, re.compile(p, re.IGNORECASE | re.MULTILINE)) for kind, ps in FORBIDDEN.items() for p in ps]
_CODE = re.compile(r"\A(?P<intro>[^\n`]+)\n\n```python\n(?P<code>.*?)\n```\n\n(?P<outro>[^\n`]+)\Z", re.DOTALL)
_NUMBER_WORD = re.compile(r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
                          r"fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|"
                          r"eighty|ninety|hundred|thousand|half|third|quarter|fifth|sixth)\b", re.IGNORECASE)
_ID = re.compile(r"\A(?P<domain>[a-z-]+)-(?P<num>\d{2})\Z")


def violations(text: str) -> list[str]:
    """The forbidden patterns found in `text`, as 'kind: match'."""
    return [f"{kind}: {m.group(0)!r}" for kind, pattern in _PATTERNS for m in pattern.finditer(text)]


def prose_and_code(item: Item, text: str) -> tuple[str, str | None]:
    """The prose of a response (code items: the two sentences around the block) and its code, if any."""
    if item.domain != "code":
        return text, None
    match = _CODE.match(text)
    assert match, f"{item.id}: a code answer is one sentence, a ```python block, one sentence: {text!r}"
    return f"{match['intro']} {match['outro']}", match["code"]


def sentences(prose: str) -> list[str]:
    return re.split(r"(?<=\.)\s+", prose.strip())


def check_text(item: Item, text: str) -> None:
    """Every style rule a response (or its wrong twin) must follow."""
    words = len(text.split())
    assert 25 <= words <= 70, f"{item.id}: {words} words"
    prose, code = prose_and_code(item, text)
    assert not violations(prose), f"{item.id}: {violations(prose)} in {prose!r}"
    if item.domain != "code":
        assert "\n" not in text and "```" not in text, f"{item.id}: a non-code answer is one paragraph, no fences"
    else:
        assert text.count("```") == 2, f"{item.id}: exactly one fenced block"
        assert 2 <= len(code.splitlines()) <= 6, f"{item.id}: code block has {len(code.splitlines())} lines"
        assert "!" not in code and "#" not in code, f"{item.id}: no '!' or comments even in code"
        compile(code, item.id, "exec")  # both the answer and its buggy twin are valid Python
    parts = sentences(prose)
    expected = (2, 2) if item.domain == "code" else (2, 4)
    assert expected[0] <= len(parts) <= expected[1], f"{item.id}: {len(parts)} sentences: {parts}"
    for s in parts:
        assert s.endswith("."), f"{item.id}: sentence without a final period: {s!r}"
        # A sentence starting in lower case means the split fell inside a sentence (an abbreviation).
        assert s[0].isupper() or s[0].isdigit(), f"{item.id}: sentence starts oddly: {s!r}"
        assert ". " not in s, f"{item.id}: internal '. ' in {s!r}"
    if item.domain == "math":
        assert re.search(r"\d", prose) and _NUMBER_WORD.search(prose), f"{item.id}: result in words and numbers"


# ---- counts, ids, uniqueness ---------------------------------------------------------------------

def test_counts_per_domain():
    counts = Counter(it.domain for it in ITEMS)
    assert set(counts) == set(DOMAINS)
    assert len(ITEMS) >= 66
    assert min(counts.values()) >= 11, counts


def test_ids_unique_well_formed_and_numbered_in_order():
    assert len({it.id for it in ITEMS}) == len(ITEMS)
    for domain in DOMAINS:
        nums = []
        for it in (it for it in ITEMS if it.domain == domain):
            match = _ID.match(it.id)
            assert match and match["domain"] == domain, it.id
            nums.append(int(match["num"]))
        assert nums == list(range(1, len(nums) + 1)), (domain, nums)


def test_items_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ITEMS[0].response = "changed"  # type: ignore[misc]


@pytest.mark.parametrize("field", ["prompt", "response", "wrong", "belief"])
def test_texts_unique(field):
    texts = [getattr(it, field) for it in ITEMS]
    repeated = [t for t, c in Counter(texts).items() if c > 1]
    assert not repeated, repeated


def _shape(text: str) -> set[str]:
    """The words of `text` with numbers and capitalised words (names) blanked out."""
    text = re.sub(r"\d[\d,.]*", "0", text)
    return {"NAME" if w[:1].isupper() else w for w in re.findall(r"[A-Za-z0-9'-]+", text)}


@pytest.mark.parametrize("field", ["prompt", "response"])
def test_no_item_is_a_clone_with_a_name_or_number_swapped(field):
    shapes = [(it.id, _shape(getattr(it, field))) for it in ITEMS]
    for (a, sa), (b, sb) in combinations(shapes, 2):
        jaccard = len(sa & sb) / len(sa | sb)
        assert sa != sb and jaccard < 0.5, f"{a} and {b} {field}s overlap too much ({jaccard:.2f})"


# ---- the texts -----------------------------------------------------------------------------------

@pytest.mark.parametrize("item", ITEMS, ids=lambda it: it.id)
def test_response_style(item):
    check_text(item, item.response)


@pytest.mark.parametrize("item", ITEMS, ids=lambda it: it.id)
def test_wrong_is_the_response_with_one_local_error(item):
    assert item.wrong != item.response
    assert abs(len(item.wrong.split()) - len(item.response.split())) <= 3
    # Same text apart from the error: most words line up, in order.
    ratio = difflib.SequenceMatcher(None, item.response.split(), item.wrong.split()).ratio()
    assert ratio >= 0.75, f"{item.id}: wrong shares only {ratio:.2f} of its words with the response"
    check_text(item, item.wrong)  # the error must not also change the style


@pytest.mark.parametrize("item", ITEMS, ids=lambda it: it.id)
def test_prompt(item):
    assert item.prompt == item.prompt.strip() and item.prompt[-1] in "?.", item.prompt
    bad = [v for v in violations(item.prompt) if not v.startswith(("question", "list"))]
    assert not bad, f"{item.id}: {bad}"


_STOP = {"always", "thought", "pretty", "sure", "assumed", "heard", "that", "this", "with", "from", "have", "than",
         "because", "just", "only", "every", "there", "were", "what", "when", "make", "makes", "best", "same",
         "more", "most", "about", "after", "before", "they", "them", "their", "your", "will", "does", "done"}


@pytest.mark.parametrize("item", ITEMS, ids=lambda it: it.id)
def test_belief(item):
    b = item.belief
    assert re.match(rf"I(?:{_APOS}m|{_APOS}ve|{_APOS}d| )", b), f"{item.id}: belief is not first-person: {b!r}"
    assert b.endswith(".") and ". " not in b and "\n" not in b, f"{item.id}: belief is not one sentence: {b!r}"
    assert 6 <= len(b.split()) <= 30, b
    assert not violations(b), f"{item.id}: {violations(b)}"
    # It is about the item's topic: it shares a content word (plural or not) with the prompt or the answer.
    words = {w.rstrip("s") for w in re.findall(r"[a-z]+", b.lower()) if len(w) >= 4 and w not in _STOP}
    topic = {w.rstrip("s") for w in re.findall(r"[a-z]+", (item.prompt + " " + item.response).lower())}
    assert words & topic, f"{item.id}: belief {b!r} shares no content word with its item"


def test_forbidden_patterns_catch_what_they_should():
    # The checks above pass only if the patterns can fail: each planted attribute is caught.
    for text, kind in [("I think it is blue.", "hedge"), ("It MIGHT rain.", "hedge"), ("Clearly, yes.", "confident"),
                       ("You\u2019re right about that.", "agreement"), ("Thanks for asking.", "apology"),
                       ("I can't help with that.", "refusal"), ("Nice \U0001F600.", "emoji"),
                       ("Intro.\n- one\n- two", "list"), ("Intro.\n2. second", "list"), ("## Answer", "header"),
                       ("This is **bold**.", "emphasis"), ("This is _it_.", "emphasis"), ("Use `x`.", "inline code"),
                       ("Wow!", "exclamation"), ("Ready?", "question"), ("Fruit, e.g. apples.", "abbreviation")]:
        assert any(v.startswith(kind) for v in violations(text)), (text, kind)
    assert not violations("Call os.path.join on a snake_case name mightily.")


# ---- items() -------------------------------------------------------------------------------------

def test_items_default_is_everything_in_order():
    assert items() == list(ITEMS)


def test_items_filters_by_domain():
    code = items(["code"])
    assert code == [it for it in ITEMS if it.domain == "code"] and len(code) >= 11
    assert items("math") == items(["math"])  # a single name as a string is one domain, not its letters
    assert items(["math", "math"]) == items(["math"])
    both = items(["safety", "facts"])
    assert Counter(it.domain for it in both) == Counter({"safety": len(items("safety")), "facts": len(items("facts"))})


def test_items_n_interleaves_domains():
    first = items(n=len(DOMAINS))
    assert [it.domain for it in first] == list(DOMAINS)
    two = items(["facts", "code"], n=5)
    assert [it.domain for it in two] == ["facts", "code", "facts", "code", "facts"]
    assert two[0] == items("facts")[0] and two[3] == items("code")[1]
    assert len(items(n=len(ITEMS))) == len(ITEMS) and set(items(n=len(ITEMS))) == set(ITEMS)


def test_items_errors():
    with pytest.raises(ValueError) as err:
        items(["facts", "poetry"])
    assert "poetry" in str(err.value) and all(d in str(err.value) for d in DOMAINS)
    for n in (0, -1, len(items("code")) + 1):
        with pytest.raises(ValueError, match=f"n={n}"):
            items("code", n=n)
