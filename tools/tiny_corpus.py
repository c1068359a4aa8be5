"""The tiny tokenizer's training corpus: a deterministic English corpus of VLN-style prompts and
answers (see :func:`tiny_corpus`). Frozen text: changing it changes the committed tokenizer.
"""

from __future__ import annotations

import random

from janus_core.index import ACTIONS
from janus_core.qwen_vision import DEFAULT_SYSTEM_PROMPT
from janus_train.data.prompt import ANSWER_LABELS

DEFAULT_CORPUS_SEED = 0

# Like the other fixed sentences of the corpus, not the prompt's current wording: the committed
# tokenizer must not change when the prompt does.
ACTIONS_SENTENCE = "The possible actions are " + ", ".join(ACTIONS) + "."

_ROOMS = (
    "kitchen", "bedroom", "bathroom", "hallway", "living room", "dining room", "office", "laundry room",
    "garage", "balcony", "corridor", "staircase", "lobby", "closet", "study", "nursery", "pantry",
    "foyer", "den", "patio", "attic", "basement", "library", "gym", "spa", "sunroom", "porch",
    "guest room", "master bedroom", "entryway", "landing", "terrace", "workshop", "playroom",
    "family room", "mudroom", "lounge", "gallery", "conference room", "reception area", "courtyard",
    "garden", "utility room", "wine cellar", "powder room", "walkway", "passage", "vestibule",
)
_OBJECTS = (
    "sofa", "couch", "table", "chair", "bed", "door", "window", "painting", "plant", "lamp", "rug",
    "shelf", "counter", "fridge", "refrigerator", "sink", "mirror", "cabinet", "television",
    "fireplace", "desk", "bookcase", "stairs", "railing", "archway", "wardrobe", "dresser", "toilet",
    "shower", "bathtub", "stool", "piano", "clock", "vase", "curtain", "column", "pillar", "ottoman",
    "armchair", "nightstand", "doorway", "island", "oven", "microwave", "washer", "dryer", "bench",
    "trash bin", "picture frame", "coffee table", "dining table", "ceiling fan", "chandelier",
    "bookshelf", "cushion", "pillow", "blanket", "towel", "basket", "printer", "computer", "monitor",
    "keyboard", "speaker", "radiator", "heater", "thermostat", "light switch", "outlet", "carpet",
    "doormat", "coat rack", "umbrella stand", "shoe rack", "sculpture", "statue", "aquarium",
    "fish tank", "counter top", "stove", "dishwasher", "kettle", "toaster", "cupboard", "drawer",
    "hamper", "ladder", "banister", "window sill", "blinds", "poster", "whiteboard", "projector",
    "treadmill", "bicycle", "suitcase", "crib", "bunk bed", "tapestry", "sideboard", "buffet",
    "wall", "floor", "ceiling", "corner", "entrance", "exit", "step", "landing", "opening",
)
_ADJECTIVES = (
    "white", "wooden", "black", "blue", "red", "grey", "brown", "glass", "large", "small", "round",
    "tall", "open", "closed", "green", "yellow", "marble", "striped", "dark", "bright", "long",
    "narrow", "wide", "metal", "leather", "beige", "orange", "purple", "pink", "golden", "silver",
    "square", "rectangular", "low", "high", "empty", "cozy", "modern", "old", "antique", "tiled",
    "carpeted", "framed", "potted", "hanging", "folding", "sliding", "double", "single", "spiral",
    "curved", "striking", "colorful", "plain", "patterned", "shiny", "wicker", "velvet", "ceramic",
    "stone", "brick", "concrete", "painted", "polished", "massive", "tiny", "huge", "light",
)
_MOTIONS = (
    "walk", "go", "head", "move", "continue", "proceed", "keep going", "travel", "step", "pass",
    "exit", "enter", "leave", "cross", "follow", "climb", "descend", "navigate", "advance", "wander",
)
_TURNS = (
    "turn left", "turn right", "make a left", "make a right", "veer left", "veer right",
    "turn around", "turn slightly left", "turn slightly right", "take a sharp left",
    "take a sharp right", "bear left", "bear right", "rotate to face",
)
_PREPOSITIONS = (
    "past", "through", "into", "towards", "around", "along", "beside", "between", "behind", "across",
    "out of", "up", "down", "next to", "in front of", "away from", "alongside", "beyond", "under",
    "over", "onto", "inside", "outside", "near", "by", "opposite",
)
_STOPS = (
    "stop", "wait", "stop next to", "wait near", "stand in front of", "stop beside", "come to a stop at",
    "halt at", "end up beside", "stop just before", "wait in the middle of", "stop when you reach",
    "remain near", "finish at",
)
_PLACEMENTS = (
    "is on the", "stands on the", "hangs on the", "sits in the", "is visible in the", "appears on the",
    "leans against the wall on the", "is mounted on the", "occupies the", "fills the",
    "can be seen in the", "is partially hidden on the",
)
_SIDES = (
    "left", "right", "center", "lower left", "lower right", "upper left", "upper right", "far end",
    "middle", "foreground", "background", "left side", "right side", "top", "bottom", "edge",
)
_RELATIONS = (
    "next to", "in front of", "behind", "under", "above", "beside", "opposite", "to the left of",
    "to the right of", "near", "far from", "on top of", "below", "against",
)
_ORDINALS = ("first", "second", "third", "fourth", "last", "next", "final", "nearest")
_DIRECTIONS = (
    "ahead", "to the left", "to the right", "behind you", "slightly left", "slightly right",
    "straight ahead", "directly in front", "diagonally left", "diagonally right", "above the floor",
    "below eye level", "at eye level",
)
_QUALIFIERS = (
    "carefully", "slowly", "quickly", "directly", "immediately", "again", "once more", "a little",
    "a bit further", "all the way", "until the end", "for a moment", "straight",
)


def _capitalise(text: str) -> str:
    return text[0].upper() + text[1:]


def _noun_phrase(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return f"the {rng.choice(_ROOMS)}"
    adjective = f"{rng.choice(_ADJECTIVES)} " if rng.random() < 0.6 else ""
    article = rng.choice(("the", "the", "the", "a", "another"))
    return f"{article} {adjective}{rng.choice(_OBJECTS)}"


def _clause(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return f"{rng.choice(_MOTIONS)} {rng.choice(_PREPOSITIONS)} {_noun_phrase(rng)}"
    if kind == 1:
        return f"{rng.choice(_TURNS)} at {_noun_phrase(rng)}"
    if kind == 2:
        return f"{rng.choice(_MOTIONS)} forward {rng.randint(2, 12)} steps"
    if kind == 3:
        return f"{rng.choice(_MOTIONS)} {rng.choice(_QUALIFIERS)} {rng.choice(_PREPOSITIONS)} {_noun_phrase(rng)}"
    if kind == 4:
        return f"{rng.choice(_TURNS)} once you see {_noun_phrase(rng)}"
    return f"take the {rng.choice(_ORDINALS)} {rng.choice(('left', 'right', 'door', 'hallway', 'exit', 'turn'))}"


def _instruction(rng: random.Random) -> str:
    clauses = [_clause(rng) for _ in range(rng.randint(2, 4))]
    clauses.append(f"{rng.choice(_STOPS)} {_noun_phrase(rng)}")
    joiner = rng.choice((", then ", ". Then ", " and ", ", and ", ". After that, "))
    return _capitalise(joiner.join(clauses[:-1]) + f" and {clauses[-1]}.")


def _description_2d(rng: random.Random) -> str:
    return _capitalise(
        f"{_noun_phrase(rng)} {rng.choice(_PLACEMENTS)} {rng.choice(_SIDES)} of the view, "
        f"{rng.choice(_RELATIONS)} {_noun_phrase(rng)}."
    )


def _description_3d(rng: random.Random) -> str:
    return _capitalise(
        f"{_noun_phrase(rng)} is about {rng.randint(0, 9)}.{rng.randint(0, 9)} meters {rng.choice(_DIRECTIONS)}, "
        f"and {_noun_phrase(rng)} is {rng.randint(1, 6)} meters {rng.choice(_DIRECTIONS)}, "
        f"{rng.choice(_RELATIONS)} {_noun_phrase(rng)}."
    )


def tiny_corpus(seed: int = DEFAULT_CORPUS_SEED, n_episodes: int = 1500) -> list[str]:
    """A deterministic English corpus of VLN-style prompts and answers to train the tiny BPE on.

    ``random.Random`` with an integer seed draws the same sequence on every platform and Python 3
    version, so the corpus (and the tokenizer trained on it) is the same everywhere.
    """
    rng = random.Random(seed)
    lines = [
        DEFAULT_SYSTEM_PROMPT,
        "You are a visual language navigation agent in an indoor environment.",
        "These are your historical observations, from the oldest to the newest:",
        "This is your current observation:",
        "Answer with four lines: the current subinstruction, a 2D description of the view, "
        "a 3D description of the scene, and the next action.",
        ACTIONS_SENTENCE,
    ]
    for _ in range(n_episodes):
        lines.append(f"Your task is to: {_instruction(rng)}")
        lines.append(
            "\n".join(
                (
                    f"{ANSWER_LABELS[0]} {_capitalise(_clause(rng))}.",
                    f"{ANSWER_LABELS[1]} {_description_2d(rng)}",
                    f"{ANSWER_LABELS[2]} {_description_3d(rng)}",
                    f"{ANSWER_LABELS[3]} {rng.choice(ACTIONS)}",
                )
            )
        )
    return lines
