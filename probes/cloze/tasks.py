"""oLMpics-style cloze tasks (Talmor et al. 2020, "oLMpics - On what language model pre-training
captures"), generated here reproducibly from templates, WordNet 3.0 and two curated lists.

Every task is multiple choice with one `<blank>` per sentence (`workbench.running.lm_inputs.BLANK`); an item
carries its choices, the index of the right one, and the content words it is made of (`slots`),
so that the same item can be rewritten with nonsense words (the language control).

Tasks (number of choices as in the paper):
- `age` (2: younger/older): "A 41 year old person is <blank> than me in age, if I am a 33 year
  old person." Ages 10..99.
- `always-never` (5: never/rarely/sometimes/often/always): "A chicken <blank> has horns." from
  `ALWAYS_NEVER`, a list of 125 statements (25 per quantifier) written for this workbench by
  hand (by the helper session that wrote this module, 2026-11-23) from common knowledge: `never`
  and `always` are impossible/definitional facts (geometry, kinship terms, anatomy); `rarely`,
  `sometimes` and `often` are events whose everyday frequency is low (well under 10%), middling
  (roughly 20-60%) and typical (most of the time) - these three are judgement calls and fuzzier than
  the two ends, as in the paper's crowd-sourced data.
- `antonym` (2: not/really): "It was <blank> hot, it was really cold." The two adjectives are a
  WordNet direct-antonym pair (answer `not`) or a synonym/similar-to pair (answer `really`).
- `objects` (2: larger/smaller): "The size of a car is <blank> than the size of a ring." from
  `OBJECT_SIZES`, 80 everyday objects with a typical longest dimension in metres written for this
  workbench (round figures from common knowledge); only pairs whose sizes differ by a factor of at
  least `OBJECT_MIN_RATIO` (4) are used, so "typical size" doubts cannot flip an answer.
- `taxonomy` (3): "A ferry and a floatplane are both a type of <blank>." The answer is a WordNet
  noun synset H; the two words are hyponyms of two different children C1, C2 of H; the
  distractors are C1 and C2 themselves, each a hypernym of one word only (the paper's hard
  distractors), checked against every noun sense of the other word.
- `multihop` (3: first/second/third): "When comparing a 23, a 38 and a 31 year old, the <blank> is
  oldest." Three distinct ages.

Construction and guarantees (asserted by tests/test_cloze.py over the whole generated set):
- deterministic given `seed` (numpy `default_rng`; WordNet is read in sorted order);
- balanced: each split holds the same number of items for every answer (index of the correct
  choice); `objects` uses every pair in both orders;
- split by lexical item: each content item (an age number, an object, an adjective, a
  statement, a WordNet answer hypernym with its words) belongs to one split, and no content word
  of a dev/test item occurs in another split;
- answers correct by construction and re-verified (`verify`) from the source (numbers, the size
  table, WordNet relations).

Language control (`nonsense_control`): the same items with every content word (`slots`: the ages,
the objects, the adjectives, the two taxonomy nouns, the content words of a statement) replaced by
a pronounceable nonsense word that is not a WordNet lemma; choices and answers stay, so the answer
distribution is unchanged and a model that reads the content should fall to chance, while one that
answers from the template or the answer prior keeps its score.

Content-free items (`content_free`): the same items with every content word replaced by ONE
neutral word (the same for every slot and every item), the "content-free input" of Zhao et al.
(2021, "Calibrate Before Use"): what remains is the task's template, the reference of the
"contextual" calibrated zero-shot rule (`probes.cloze.scoring`).

Domain premises (`DOMAIN_PREMISES`, `in_domain`, `domain_only`): one short hand-written string per
task, holding the answer's `<blank>` and no content word, for the "pmi_dc" rule (domain-conditional
PMI, Holtzman et al. 2021, whose premises are such strings: " the answer is:", COPA's " because").
The item is asked as the item with its gap written "___" followed by the string (the answer comes
after the whole item, so every head, a causal LM too, reads all of it before the answer); the
domain premise is the string alone.

Differences from Talmor et al. (2020), on purpose:
- The paper's data (ConceptNet, Wikidata, crowd-sourcing; links now dead) is not reproduced; the
  tasks are regenerated from WordNet 3.0 and the two hand-made lists above. Sizes: up to 2,000
  train / 500 dev / 500 test items per task where the lexicon allows it (`always-never` has 125
  statements in all: 75/25/25; `objects` has as many as its split's pairs allow).
- Splits are by lexical item (the paper split items at random, so an age or a word could appear
  in train and test): a stricter test of generalisation when fine-tuning.
- The paper's language control for fine-tuning ("no language": the input replaced by [MASK]s
  except the key tokens) is replaced by the nonsense-word control described above, which also
  works zero-shot.
- `antonym`: the "really" items use a WordNet synonym or "similar to" adjective of the first word
  (the paper used crowd-checked synonyms).
- `objects`: the size table is hand-written (the paper mined sizes from a corpus).
- `taxonomy`: distractors are the two children C1, C2 of the answer (the paper: hypernyms of one
  word each, from its ontology); only single-word, non-capitalised WordNet lemmas with a tagged
  sense count >= 1 are used.
- Not provided: property conjunction (needs ConceptNet properties with crowd-validated
  distractors) and encyclopedic composition (needs Wikidata triples): neither resource is in the
  data root and hand-writing them would not be the paper's task, so they are left out rather than
  imitated.

Concerns:
- the item and its text (articles, slots): `ClozeItem`, `article`, `render`
- the tasks' generators and their check against the sources: `generate`, `verify`, `split`
- the controls (nonsense words, content-free and domain-only inputs): `nonsense_word`,
  `nonsense_control`, `content_free`, `in_domain`, `domain_only`
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from workbench.errors import ConfigError
from workbench.running.lm_inputs import BLANK

TASKS = ("age", "always-never", "antonym", "objects", "taxonomy", "multihop")
SPLITS = ("train", "dev", "test")
DEFAULT_SIZES = {"train": 2000, "dev": 500, "test": 500}
SPLIT_FRACTIONS = (0.6, 0.2, 0.2)  # share of lexical items per split
AGES = tuple(range(10, 100))
OBJECT_MIN_RATIO = 4.0

CHOICES = {
    "age": ("younger", "older"),
    "always-never": ("never", "rarely", "sometimes", "often", "always"),
    "antonym": ("not", "really"),
    "objects": ("larger", "smaller"),
    "multihop": ("first", "second", "third"),
}
TEMPLATES = {
    "age": "{A0} {0} year old person is " + BLANK + " than me in age, if I am {a1} {1} year old person.",
    "antonym": "It was " + BLANK + " {0}, it was really {1}.",
    "objects": "The size of {a0} {0} is " + BLANK + " than the size of {a1} {1}.",
    "taxonomy": "{A0} {0} and {a1} {1} are both a type of " + BLANK + ".",
    "multihop": "When comparing {a0} {0}, {a1} {1} and {a2} {2} year old, the " + BLANK + " is oldest.",
}

# The "pmi_dc" rule's domain premise per task (module docstring): a question about the item's gap,
# phrased so that each choice completes it, with no content word of any item.
DOMAIN_PREMISES = {
    "age": "In age, the first person is " + BLANK + ".",
    "always-never": "It " + BLANK + " happens.",
    "antonym": "The missing word is " + BLANK + ".",
    "objects": "In size, the first is " + BLANK + ".",
    "taxonomy": "Both are a type of " + BLANK + ".",
    "multihop": "The oldest is the " + BLANK + ".",
}
GAP = "___"  # the item's blank when the answer is asked after it (`in_domain`)

# --------------------------------------------------------------------------- curated lists
# always-never: statement with <blank> where the quantifier goes, and its true quantifier.
# Hand-written for this workbench (see the module docstring); 25 per quantifier.
ALWAYS_NEVER: tuple[tuple[str, str], ...] = tuple(
    (s.replace("_", BLANK), q) for q, block in (
        ("never", """A chicken _ has horns. | A rock _ breathes. | A triangle _ has four sides. |
         A stone _ eats food. | A car _ lays eggs. | A bachelor _ has a wife. | A cow _ has wings. |
         A table _ speaks. | A fish _ has fur. | A circle _ has corners. | A spoon _ sings. |
         A horse _ has feathers. | A tree _ walks. | A book _ barks. | The sun _ rises in the west. |
         A whale _ lives in the desert. | A pencil _ sleeps. | A cat _ has gills. | A dead man _ breathes. |
         An elephant _ fits in a cup. | A brick _ floats in the air. | A snail _ runs a marathon. |
         A window _ grows hair. | A shoe _ drinks milk. | A cloud _ wears a hat."""),
        ("always", """A square _ has four corners. | A bachelor _ is unmarried. | Water _ is wet. |
         Fire _ is hot. | A week _ has seven days. | A bird _ has feathers. | A year _ has twelve months. |
         A spider _ has eight legs. | A person _ has a heart. | A dog _ is an animal. | Ice _ is cold. |
         A cube _ has six faces. | A minute _ has sixty seconds. | A piano _ has keys. |
         An insect _ has six legs. | A sister _ is female. | A rose _ is a flower. | A mother _ has a child. |
         A triangle _ has three corners. | A widow _ has lost her husband. | A circle _ is round. |
         A bicycle _ has pedals. | An uncle _ is male. | A century _ has one hundred years. |
         A dozen _ means twelve."""),
        ("sometimes", """A tossed coin _ lands on heads. | A rolled die _ shows an even number. |
         A newborn baby _ is a girl. | A person _ wears glasses. | A spring day _ is rainy. |
         A football match _ ends in a draw. | A student _ fails an exam. | The sky _ is cloudy. |
         A dog _ chases its tail. | A train _ arrives late. | A friend _ forgets a birthday. |
         A cat _ sleeps on the bed. | A road _ has potholes. | A movie _ has a sad ending. |
         A meal _ includes dessert. | A house _ has a garden. | A bus _ is crowded. |
         A neighbour _ plays loud music. | A teenager _ stays up late. | A shop _ has a sale. |
         A tennis player _ loses a match. | A letter _ arrives late. | A farmer _ has a bad harvest. |
         A computer _ crashes. | A waiter _ drops a plate."""),
        ("often", """A baby _ cries. | A dog _ wags its tail. | Children _ play games. |
         It _ rains in a rainforest. | A teacher _ grades homework. | A bird _ sings in the morning. |
         A doctor _ sees patients. | A runner _ sweats. | A politician _ gives speeches. |
         A city street _ is busy. | A summer day _ is warm. | A winter night _ is cold. |
         A cook _ uses salt. | A farmer _ wakes up early. | A cow _ eats grass. |
         A fisherman _ catches fish. | A child _ asks questions. | A puppy _ chews shoes. |
         A highway _ has traffic at rush hour. | A pianist _ practises. | A student _ reads books. |
         A desert _ is dry. | A bee _ visits flowers. | A pilot _ flies. | A library _ is quiet."""),
        ("rarely", """A person _ lives to be one hundred years old. | A golfer _ hits a hole in one. |
         It _ snows in the desert. | A lottery player _ wins the jackpot. | A coin _ lands on its edge. |
         A cat _ swims. | A plane _ crashes. | A mother _ has triplets. | A volcano _ erupts. |
         A dog _ bites its owner. | A hiker _ climbs Mount Everest. | A baby _ is born with teeth. |
         An athlete _ breaks a world record. | A house _ burns down. | A solar eclipse _ happens. |
         A student _ gets a perfect score. | A cat _ likes baths. | A walker _ finds a four-leaf clover. |
         A whale _ swims onto the beach. | An earthquake _ hits London. | A diamond _ breaks. |
         A snake _ enters a house. | A fisherman _ catches a shark. | A tourist _ sees a comet. |
         A driver _ hits a deer."""),
    ) for s in (x.strip() for x in block.split("|"))
)
assert all(sum(q == c for _, q in ALWAYS_NEVER) == 25 for c in CHOICES["always-never"])

# objects: typical longest dimension in metres (round figures, hand-written for this workbench).
OBJECT_SIZES: dict[str, float] = {
    "ant": 0.005, "pea": 0.008, "bee": 0.015, "button": 0.015, "marble": 0.015, "ring": 0.02,
    "grape": 0.02, "coin": 0.025, "strawberry": 0.03, "walnut": 0.03, "key": 0.06, "egg": 0.06,
    "lemon": 0.08, "apple": 0.08, "mouse": 0.08, "cup": 0.1, "phone": 0.15, "spoon": 0.17,
    "pencil": 0.18, "banana": 0.2, "brick": 0.22, "book": 0.24, "plate": 0.26, "shoe": 0.28,
    "bottle": 0.3, "hat": 0.3, "laptop": 0.35, "rabbit": 0.4, "cat": 0.5, "pillow": 0.6,
    "suitcase": 0.7, "dog": 0.8, "chair": 0.9, "umbrella": 0.9, "guitar": 1.0, "desk": 1.4,
    "table": 1.5, "piano": 1.5, "bicycle": 1.7, "fridge": 1.8, "door": 2.0, "bed": 2.0,
    "sofa": 2.0, "horse": 2.4, "cow": 2.4, "canoe": 4.5, "car": 4.5, "giraffe": 5.0,
    "elephant": 6.0, "boat": 6.0, "truck": 10.0, "bus": 12.0, "house": 15.0, "tree": 15.0,
    "whale": 25.0, "airplane": 40.0, "church": 40.0, "castle": 100.0, "ship": 200.0,
    "train": 200.0, "stadium": 250.0, "skyscraper": 300.0, "bridge": 500.0, "village": 1000.0,
    "mountain": 5000.0, "lake": 5000.0, "island": 10000.0, "city": 20000.0, "country": 1e6,
    "moon": 3.5e6, "planet": 1e7, "ocean": 1e7, "sun": 1.4e9, "galaxy": 1e21,
    "flea": 0.002, "sock": 0.25, "wallet": 0.11, "tent": 3.0, "garage": 6.0, "tractor": 5.0,
}
assert len(OBJECT_SIZES) == 80

FUNCTION_WORDS = frozenset(["a", "an", "the", "is", "are", "its", "his", "her", "their", "to", "of", "in", "on", "at", "by", "for", "with", "and", "or", "during", "one", "up", "onto", "into", "has", "have", "lost"])


@dataclass(frozen=True)
class ClozeItem:
    """One multiple-choice cloze item. `text` holds one BLANK; `choices[answer]` is right;
    `slots` are the content words `template` is filled with (see `render`); `key` names the
    lexical item the split is made by."""

    task: str
    split: str
    text: str
    choices: tuple[str, ...]
    answer: int
    template: str
    slots: tuple[str, ...]
    key: str

    @property
    def content_words(self) -> frozenset[str]:
        """Words a split must not share with another split (choices of taxonomy included)."""
        words = {s.lower() for s in self.slots}
        if self.task == "taxonomy":
            words |= {c.lower() for c in self.choices}
        if self.task == "always-never":
            words = {self.key}
        return frozenset(words)


def article(word: str) -> str:
    """Indefinite article by sound: "an" before a vowel letter and before the numbers (ages)
    said with a vowel sound (8, 11, 18, 80-89)."""
    if word[:1].isdigit():
        return "an" if word.startswith("8") or word in ("11", "18") else "a"
    return "an" if word[:1].lower() in "aeiou" else "a"


def render(template: str, slots: Sequence[str]) -> str:
    """Fill `{i}` with slots[i] and `{ai}` / `{Ai}` with its indefinite article (capitalised)."""
    def sub(m: re.Match) -> str:
        kind, i = m.group(1), int(m.group(2))
        if kind == "":
            return slots[i]
        art = article(slots[i])
        return art.capitalize() if kind == "A" else art

    return re.sub(r"\{(a|A|)(\d+)\}", sub, template)


def _item(task, split, template, slots, choices, answer, key) -> ClozeItem:
    slots = tuple(str(s) for s in slots)
    return ClozeItem(task, split, render(template, slots), tuple(choices), int(answer), template, slots, key)


def _split_items(items: Sequence, seed: int, salt: int) -> dict[str, list]:
    """Seeded partition of lexical items into train/dev/test by SPLIT_FRACTIONS."""
    items = sorted(items)
    order = np.random.default_rng([seed, salt]).permutation(len(items))
    n = len(items)
    a = round(SPLIT_FRACTIONS[0] * n)
    b = a + round(SPLIT_FRACTIONS[1] * n)
    cut = {"train": order[:a], "dev": order[a:b], "test": order[b:]}
    return {s: [items[i] for i in sorted(idx)] for s, idx in cut.items()}


def _balanced_count(n: int, k: int) -> int:
    return (n // k) * k


# --------------------------------------------------------------------------- generators


def _age(seed: int, sizes: dict) -> list[ClozeItem]:
    out = []
    for split, ages in _split_items(AGES, seed, 1).items():
        rng = np.random.default_rng([seed, 11, SPLITS.index(split)])
        n = _balanced_count(sizes[split], 2)
        pairs = [(x, y) for x in ages for y in ages if x != y]
        younger = [p for p in pairs if p[0] < p[1]]
        older = [p for p in pairs if p[0] > p[1]]
        k = min(n // 2, len(younger))  # distinct ordered pairs only
        for label, pool in ((0, younger), (1, older)):
            for j in sorted(rng.choice(len(pool), size=k, replace=False)):
                x, y = pool[j]
                out.append(_item("age", split, TEMPLATES["age"], (x, y), CHOICES["age"], label, f"{x}|{y}"))
    return out


def _multihop(seed: int, sizes: dict) -> list[ClozeItem]:
    out = []
    for split, ages in _split_items(AGES, seed, 1).items():  # same age split as `age`
        rng = np.random.default_rng([seed, 16, SPLITS.index(split)])
        n = min(_balanced_count(sizes[split], 3), _balanced_count(len(ages) * (len(ages) - 1) * (len(ages) - 2) // 6, 3))
        used: set[tuple[int, ...]] = set()
        for i in range(n):
            trio = rng.choice(ages, size=3, replace=False)
            while tuple(sorted(trio)) in used:  # distinct sets of three ages
                trio = rng.choice(ages, size=3, replace=False)
            used.add(tuple(sorted(trio)))
            want = i % 3  # position of the oldest
            oldest = int(np.argmax(trio))
            trio[[oldest, want]] = trio[[want, oldest]]
            out.append(_item("multihop", split, TEMPLATES["multihop"], [int(t) for t in trio],
                             CHOICES["multihop"], want, "|".join(str(int(t)) for t in trio)))
    return out


def _always_never(seed: int, sizes: dict) -> list[ClozeItem]:
    out = []
    choices = CHOICES["always-never"]
    for label, q in enumerate(choices):
        statements = [s for s, qq in ALWAYS_NEVER if qq == q]
        for split, chosen in _split_items(statements, seed, 2 + label).items():
            for s in chosen[: sizes[split] // len(choices)]:
                words = re.findall(r"[A-Za-z'-]+|<blank>|[^\sA-Za-z]", s.replace(BLANK, " <blank> "))
                slots, parts = [], []
                for w in words:
                    if w == "<blank>" or w.lower() in FUNCTION_WORDS or not w[0].isalpha():
                        parts.append(BLANK if w == "<blank>" else w)
                    else:
                        parts.append(f"{{{len(slots)}}}")
                        slots.append(w)
                for k in range(len(parts) - 1):  # an article before a slot follows the slot's word
                    m = re.fullmatch(r"\{(\d+)\}", parts[k + 1])
                    if m and parts[k].lower() in ("a", "an"):
                        parts[k] = "{" + ("A" if parts[k][0].isupper() else "a") + m.group(1) + "}"
                template = " ".join(parts).replace(" .", ".")
                out.append(_item("always-never", split, template, slots, choices, label, s))
    return out


def _objects(seed: int, sizes: dict) -> list[ClozeItem]:
    out = []
    for split, objs in _split_items(list(OBJECT_SIZES), seed, 3).items():
        pairs = [(x, y) for x in objs for y in objs if x < y
                 and max(OBJECT_SIZES[x], OBJECT_SIZES[y]) / min(OBJECT_SIZES[x], OBJECT_SIZES[y]) >= OBJECT_MIN_RATIO]
        rng = np.random.default_rng([seed, 13, SPLITS.index(split)])
        pairs = [pairs[i] for i in rng.permutation(len(pairs))][: sizes[split] // 2]
        for x, y in pairs:
            for a, b in ((x, y), (y, x)):
                label = 0 if OBJECT_SIZES[a] > OBJECT_SIZES[b] else 1
                out.append(_item("objects", split, TEMPLATES["objects"], (a, b), CHOICES["objects"], label, f"{a}|{b}"))
    return out


def _usable(lemma_name: str) -> bool:
    return lemma_name.isalpha() and lemma_name.islower() and 3 <= len(lemma_name) <= 14


@lru_cache(maxsize=1)
def _sense_counts() -> dict[str, int]:
    """WordNet's tagged sense counts (cntlist.rev: `sense_key sense_number count`); NLTK's
    `Lemma.count()` re-reads the file for every lemma, far too slow for a pass over WordNet."""
    from workbench.data.wordnet import wordnet_dir

    counts: dict[str, int] = {}
    with open(wordnet_dir() / "cntlist.rev", encoding="utf-8") as f:
        for line in f:
            key, _, cnt = line.split()
            counts[key] = int(cnt)
    return counts


def _common(lemma) -> bool:
    """A usable single word with a tagged sense count >= 1 (it occurs in SemCor)."""
    return _usable(lemma.name()) and _sense_counts().get(lemma.key(), 0) >= 1


NEGATION_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non", "a")


def _morphological(a: str, b: str) -> bool:
    """unable/able, dishonest/honest: antonyms a surface cue gives away (left out)."""
    return any(x == p + y for p in NEGATION_PREFIXES for x, y in ((a, b), (b, a)))


@lru_cache(maxsize=1)
def _antonym_pairs() -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """(antonym pairs, synonym pairs) of common single-word adjectives, from WordNet 3.0.

    Antonyms: direct lexical antonymy (hot/cold), without morphological negations (able/unable).
    Synonyms: another lemma of the same synset or of a "similar to" satellite (hot/torrid),
    checked not to be an antonym of the word in any sense."""
    from workbench.data.wordnet import wordnet

    ants, syns = set(), set()
    for s in sorted(wordnet().all_synsets("a"), key=lambda x: x.name()):
        for lm in s.lemmas():
            w = lm.name()
            if not _common(lm):
                continue
            for a in lm.antonyms():
                if _common(a) and not _morphological(w, a.name()):
                    ants.add((w, a.name()))
            near = [x for x in s.lemmas() if x.name() != w] + [x for t in s.similar_tos() for x in t.lemmas()]
            for x in near:
                if _common(x) and x.name() != w:
                    syns.add((w, x.name()))
    antonymous = ants | {(b, a) for a, b in ants}
    syns = {p for p in syns if p not in antonymous}
    return tuple(sorted(ants)), tuple(sorted(syns))


def _components(pairs) -> list[tuple[str, ...]]:
    """Connected components of the graph whose edges are `pairs` (union-find), sorted."""
    parent: dict[str, str] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for x in parent:
        groups.setdefault(find(x), []).append(x)
    return sorted(tuple(sorted(g)) for g in groups.values())


def _antonym(seed: int, sizes: dict) -> list[ClozeItem]:
    ants, syns = _antonym_pairs()
    # Words linked by antonymy share a split (so every antonym pair is usable); every other word
    # is a group of its own. A synonym pair is used when both its words fall in one split.
    groups = _components(ants)
    grouped = {w for g in groups for w in g}
    groups += [(w,) for w in sorted({w for p in syns for w in p} - grouped)]
    split_of = {w: s for s, gs in _split_items(groups, seed, 4).items() for g in gs for w in g}
    out = []
    for split in SPLITS:
        rng = np.random.default_rng([seed, 14, SPLITS.index(split)])
        pools = [[p for p in pairs if split_of[p[0]] == split_of[p[1]] == split] for pairs in (ants, syns)]
        n = min(sizes[split] // 2, *(len(p) for p in pools))
        for label, pool in enumerate(pools):  # 0: "not" (antonyms), 1: "really" (synonyms)
            for j in sorted(rng.choice(len(pool), size=n, replace=False)):
                a, b = pool[j]
                out.append(_item("antonym", split, TEMPLATES["antonym"], (a, b), CHOICES["antonym"], label, f"{a}|{b}"))
    return out


@lru_cache(maxsize=4096)
def _hypernym_names(word: str) -> frozenset[str]:
    """Lemma names of every (instance) hypernym, at any depth, of any noun sense of `word`."""
    from workbench.data.wordnet import wordnet

    return frozenset(lm.name() for s in wordnet().synsets(word, "n")
                     for h in s.closure(lambda x: x.hypernyms() + x.instance_hypernyms()) for lm in h.lemmas())


@lru_cache(maxsize=1)
def _taxonomy_candidates() -> tuple[tuple[str, str, str, str, str], ...]:
    """(answer H, child C1, child C2, word W1 under C1, word W2 under C2), all common single
    words (the synset's first common lemma); no sense of W1 is a kind of C2, none of W2 a C1
    (checked on lemma names over every noun sense, as `verify` does)."""
    from workbench.data.wordnet import wordnet

    def name(s):
        good = [lm for lm in s.lemmas() if _common(lm)]
        return good[0].name() if good else None

    out = []
    for h in sorted(wordnet().all_synsets("n"), key=lambda x: x.name()):
        hn = name(h)
        if hn is None:
            continue
        kids = []
        for c in sorted(h.hyponyms(), key=lambda x: x.name()):
            cn = name(c)
            ws = sorted({name(g) for g in c.hyponyms()} - {None, hn, cn})
            if cn and ws:
                kids.append((cn, ws[:3]))
        for i in range(len(kids)):
            for j in range(i + 1, len(kids)):
                (n1, ws1), (n2, ws2) = kids[i], kids[j]
                if n1 == n2:
                    continue
                for w1 in ws1:
                    for w2 in ws2:
                        if w1 == w2 or {w1, w2} & {hn, n1, n2}:
                            continue
                        a1, a2 = _hypernym_names(w1), _hypernym_names(w2)
                        if n2 in a1 or n1 in a2 or hn not in a1 or hn not in a2:
                            continue
                        out.append((hn, n1, n2, w1, w2))
    return tuple(out)


def _taxonomy(seed: int, sizes: dict) -> list[ClozeItem]:
    cands = _taxonomy_candidates()
    split_of = {h: s for s, hs in _split_items(sorted({c[0] for c in cands}), seed, 5).items() for h in hs}
    out: list[ClozeItem] = []
    seen: set[str] = set()  # content words of earlier splits
    for split in SPLITS:
        rng = np.random.default_rng([seed, 15, SPLITS.index(split)])
        pool = [c for c in cands if split_of[c[0]] == split and not (set(c) & seen)]
        n = min(_balanced_count(sizes[split], 3), _balanced_count(len(pool), 3))
        picked = [pool[j] for j in rng.permutation(len(pool))[:n]]
        for i, (hn, n1, n2, w1, w2) in enumerate(picked):
            pos = i % 3
            distractors = [n1, n2] if rng.random() < 0.5 else [n2, n1]
            choices = distractors[:pos] + [hn] + distractors[pos:]
            out.append(_item("taxonomy", split, TEMPLATES["taxonomy"], (w1, w2), choices, pos, hn))
        seen |= {w for it in out if it.split == split for w in it.content_words}
    return out


GENERATORS = {"age": _age, "always-never": _always_never, "antonym": _antonym, "objects": _objects,
              "taxonomy": _taxonomy, "multihop": _multihop}


def generate(task: str, seed: int = 0, sizes: dict | None = None) -> list[ClozeItem]:
    """Items of one task for all three splits (train, dev, test order); `sizes` caps each split
    (default `DEFAULT_SIZES`; fewer where the lexicon has fewer items)."""
    if task not in GENERATORS:
        raise ConfigError(f"unknown cloze task {task!r}; known: {', '.join(TASKS)}")
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    bad = [k for k in sizes if k not in SPLITS]
    if bad:
        raise ConfigError(f"cloze sizes: unknown splits {bad}")
    items = GENERATORS[task](int(seed), sizes)
    return sorted(items, key=lambda it: SPLITS.index(it.split))


# --------------------------------------------------------------------------- verification


def verify(item: ClozeItem) -> bool:
    """Re-derive the answer of an item from its source (numbers, the size table, WordNet)."""
    t, s = item.task, item.slots
    if t == "age":
        right = "younger" if int(s[0]) < int(s[1]) else "older"
    elif t == "multihop":
        right = CHOICES["multihop"][int(np.argmax([int(x) for x in s]))]
    elif t == "objects":
        right = "larger" if OBJECT_SIZES[s[0]] > OBJECT_SIZES[s[1]] else "smaller"
    elif t == "always-never":
        right = dict(ALWAYS_NEVER)[item.key]
    elif t == "antonym":
        from workbench.data.wordnet import antonyms

        is_ant = s[1] in antonyms(s[0], "a") or s[0] in antonyms(s[1], "a")
        right = "not" if is_ant else "really"
        if not is_ant and not _related_adjectives(s[0], s[1]):
            return False
    elif t == "taxonomy":
        right = _taxonomy_answer(item)
    else:
        raise ConfigError(f"unknown cloze task {t!r}")
    return right is not None and item.choices[item.answer] == right


def _related_adjectives(a: str, b: str) -> bool:
    from workbench.data.wordnet import wordnet

    for s in wordnet().synsets(a, "a"):
        near = {lm.name() for lm in s.lemmas()} | {lm.name() for t in s.similar_tos() for lm in t.lemmas()}
        if b in near:
            return True
    return False


def _taxonomy_answer(item: ClozeItem) -> str | None:
    """The one choice that is a hypernym (of some noun sense) of both words, else None."""
    both = _hypernym_names(item.slots[0]) & _hypernym_names(item.slots[1])
    shared = [c for c in item.choices if c in both]
    return shared[0] if len(shared) == 1 else None


# --------------------------------------------------------------------------- language control

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "bl", "br", "dr", "fl", "gl", "gr", "kl", "pl", "pr", "sk", "sl", "sp", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u"]
_CODAS = ["b", "d", "g", "k", "l", "m", "n", "p", "s", "t", "x"]


@lru_cache(maxsize=1)
def _real_words() -> frozenset[str]:
    from workbench.data.wordnet import wordnet

    return frozenset(w.lower() for w in wordnet().all_lemma_names())


def nonsense_word(rng: np.random.Generator) -> str:
    """A pronounceable 2-3 syllable non-word (onset-vowel syllables + a coda), not a WordNet lemma."""
    real = _real_words()
    while True:
        syl = int(rng.integers(2, 4))
        w = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))] for _ in range(syl))
        w += _CODAS[rng.integers(len(_CODAS))]
        if w not in real:
            return w


def nonsense_control(items: Sequence[ClozeItem], seed: int = 0) -> list[ClozeItem]:
    """The same items with each distinct content word (slot) replaced by a nonsense word (one
    per distinct word within an item; seeded per item index). Choices and answers unchanged."""
    out = []
    for i, it in enumerate(items):
        rng = np.random.default_rng([seed, 99, i])
        mapping: dict[str, str] = {}
        for s in it.slots:
            if s.lower() not in mapping:
                w = nonsense_word(rng)
                while w in mapping.values():
                    w = nonsense_word(rng)
                mapping[s.lower()] = w.capitalize() if s[:1].isupper() else w
        new = tuple(mapping[s.lower()] for s in it.slots)
        out.append(replace(it, slots=new, text=render(it.template, new)))
    return out


def content_free(items: Sequence[ClozeItem], word: str) -> list[ClozeItem]:
    """The items with every content word (slot) replaced by `word` (articles re-derived from it, so
    "an 80 year old" and "a 41 year old" both become "a <word> year old"): the template alone, the
    same text for every item of a one-template task. Choices and answers unchanged."""
    if not word or any(ch.isspace() for ch in word) or "{" in word or BLANK in word:
        raise ConfigError(f"content-free word must be one non-empty word without braces, got {word!r}")
    return [replace(it, slots=tuple(word for _ in it.slots), text=render(it.template, [word] * len(it.slots)))
            for it in items]


def in_domain(items: Sequence[ClozeItem]) -> list[ClozeItem]:
    """The items asked the "pmi_dc" way: the item with its blank written `GAP`, then its task's
    domain premise, whose blank the answer fills ("A 41 year old person is ___ than me in age, if I
    am a 33 year old person. In age, the first person is <blank>.")."""
    return [replace(it, text=f"{it.text.replace(BLANK, GAP)} {DOMAIN_PREMISES[it.task]}") for it in items]


def domain_only(items: Sequence[ClozeItem]) -> list[ClozeItem]:
    """The items' domain premises alone (the "pmi_dc" rule's x_domain): one text per task."""
    return [replace(it, text=DOMAIN_PREMISES[it.task]) for it in items]


def split(items: Sequence[ClozeItem], name: str) -> list[ClozeItem]:
    return [it for it in items if it.split == name]
