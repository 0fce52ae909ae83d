"""A seeded generator of a small fictional encyclopedia: the sample corpus of the search env.

Towns, people, institutes and rivers that refer to each other (a town's founder has an article
of their own, who was born in another town, ...), so questions can need two documents. Every fact
comes from one consistent table, so the articles never contradict each other. The files are
Markdown, HTML and plain text, under ``towns/``, ``people/``, ``institutes/`` and ``rivers/``.
Nothing is downloaded; `envs/builtin/search/sample_corpus/` in the repository is
``python -m gymflow.envs.builtin.search.sample envs/builtin/search/sample_corpus --docs 60``.
"""

from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

_SYLLABLES = [
    "var",
    "hol",
    "tes",
    "sa",
    "ly",
    "bren",
    "dor",
    "mi",
    "ka",
    "lo",
    "ven",
    "ras",
    "tor",
    "el",
    "un",
    "fal",
    "grim",
    "oss",
    "quen",
    "ri",
    "sto",
    "wen",
    "zar",
    "bel",
    "cor",
    "dun",
    "ny",
    "ash",
    "mor",
    "ith",
]
_FIRST = [
    "Elena",
    "Tomas",
    "Ingrid",
    "Marek",
    "Sofia",
    "Anton",
    "Lidia",
    "Pavel",
    "Runa",
    "Oskar",
    "Vera",
    "Emil",
    "Hanna",
    "Jonas",
    "Katya",
    "Lukas",
    "Mira",
    "Nils",
    "Olga",
    "Piet",
    "Greta",
    "Ivo",
    "Dana",
    "Felix",
]
_LAST = [
    "Marsh",
    "Halden",
    "Voss",
    "Kerrin",
    "Ostrova",
    "Brandt",
    "Lindqvist",
    "Amsel",
    "Tarrow",
    "Quill",
    "Wendt",
    "Sorel",
    "Falk",
    "Drummond",
    "Eckhart",
    "Morrow",
    "Nyberg",
    "Pell",
    "Rask",
    "Stroud",
    "Ulven",
    "Varga",
]
_FIELDS = ["astronomy", "hydrology", "botany", "cartography", "metallurgy", "linguistics", "glass making", "optics"]
_REGIONS = ["northern", "southern", "eastern", "western", "coastal", "highland"]
_INDUSTRIES = ["timber", "salt", "wool", "copper", "fishing", "clockmaking", "paper", "barley"]


@dataclass
class _World:
    towns: list[dict[str, object]] = field(default_factory=list)
    people: list[dict[str, object]] = field(default_factory=list)
    institutes: list[dict[str, object]] = field(default_factory=list)
    rivers: list[dict[str, object]] = field(default_factory=list)


def _name(rng: random.Random, used: set[str], parts: int = 2) -> str:
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(parts + rng.randint(0, 1))).capitalize()
        if name not in used and len(name) >= 5:
            used.add(name)
            return name


def build_world(docs: int, seed: int) -> _World:
    """The fact table of a corpus of about `docs` articles."""
    rng = random.Random(f"sample-corpus:{seed}")
    used: set[str] = set()
    n_towns, n_rivers = max(2, docs * 3 // 10), max(1, docs // 10)
    n_institutes = max(1, docs * 2 // 10)
    n_people = max(2, docs - n_towns - n_rivers - n_institutes)
    world = _World()
    people_names: set[str] = set()
    for _ in range(n_people):
        while (full_name := f"{rng.choice(_FIRST)} {rng.choice(_LAST)}") in people_names:
            pass
        people_names.add(full_name)
        world.people.append({"name": full_name, "born": rng.randint(1650, 1890), "field": rng.choice(_FIELDS)})
    for _ in range(n_rivers):
        world.rivers.append({"name": f"River {_name(rng, used)}", "length": rng.randint(40, 900)})
    for _ in range(n_towns):
        world.towns.append(
            {
                "name": _name(rng, used),
                "region": rng.choice(_REGIONS),
                "founded": rng.randint(1100, 1800),
                "founder": rng.choice(world.people)["name"],
                "river": rng.choice(world.rivers)["name"],
                "population": rng.randint(800, 90000),
                "industry": rng.choice(_INDUSTRIES),
            }
        )
    for person in world.people:
        person["birthplace"] = rng.choice(world.towns)["name"]
    for _ in range(n_institutes):
        town = rng.choice(world.towns)
        world.institutes.append(
            {
                "name": f"{rng.choice(_LAST)} Institute of {rng.choice(_FIELDS).title()}",
                "town": town["name"],
                "established": rng.randint(1700, 1950),
                "director": rng.choice(world.people)["name"],
            }
        )
    unique: dict[object, dict[str, object]] = {}
    for institute in world.institutes:
        unique.setdefault(institute["name"], institute)
    world.institutes = list(unique.values())
    for person in world.people:
        person["institute"] = rng.choice(world.institutes)["name"]
    return world


def _town(t: dict[str, object], w: _World) -> tuple[str, list[tuple[str, list[str]]]]:
    institutes = [i["name"] for i in w.institutes if i["town"] == t["name"]]
    natives = [p["name"] for p in w.people if p["birthplace"] == t["name"]]
    overview = [
        f"{t['name']} is a town in the {t['region']} region.",
        f"It lies on the banks of the {t['river']}.",
        f"{t['name']} had a population of {t['population']} at the last census.",
    ]
    history = [
        f"{t['name']} was founded in {t['founded']} by {t['founder']}.",
        f"For centuries its economy rested on {t['industry']}.",
    ]
    people = [f"The {i} is located in {t['name']}." for i in institutes]
    people += [f"{p} was born in {t['name']}." for p in natives[:3]]
    sections = [("Overview", overview), ("History", history)] + (
        [("Institutions and people", people)] if people else []
    )
    return str(t["name"]), sections


def _person(p: dict[str, object], w: _World) -> tuple[str, list[tuple[str, list[str]]]]:
    founded = [t["name"] for t in w.towns if t["founder"] == p["name"]]
    directed = [i["name"] for i in w.institutes if i["director"] == p["name"]]
    life = [
        f"{p['name']} was born in {p['birthplace']} in {p['born']}.",
        f"{p['name']} studied {p['field']} at the {p['institute']}.",
    ]
    work = [f"{p['name']} founded {town}." for town in founded]
    work += [f"{p['name']} served as director of the {inst}." for inst in directed]
    work.append(f"{p['name']} is remembered as a pioneer of {p['field']}.")
    return str(p["name"]), [("Life", life), ("Work", work)]


def _institute(i: dict[str, object], w: _World) -> tuple[str, list[tuple[str, list[str]]]]:
    del w
    facts = [
        f"The {i['name']} was established in {i['established']} in {i['town']}.",
        f"Its first director was {i['director']}.",
        "It keeps a library and a small public collection.",
    ]
    return str(i["name"]), [("History", facts)]


def _river(r: dict[str, object], w: _World) -> tuple[str, list[tuple[str, list[str]]]]:
    towns = [t["name"] for t in w.towns if t["river"] == r["name"]]
    course = [f"The {r['name']} is {r['length']} kilometres long."]
    if towns:
        course.append(f"The {r['name']} flows through {', '.join(map(str, towns[:4]))}.")
    return str(r["name"]), [("Course", course)]


def _render(title: str, sections: list[tuple[str, list[str]]], kind: str) -> str:
    if kind == "html":
        body = "".join(f"<h2>{name}</h2>\n<p>{' '.join(facts)}</p>\n" for name, facts in sections)
        head = f"<head><title>{title}</title><style>p{{}}</style></head>"
        return f"<html>{head}<body>\n<h1>{title}</h1>\n{body}</body></html>\n"
    body = "".join(f"\n## {name}\n\n{' '.join(facts)}\n" for name, facts in sections)
    return f"# {title}\n{body}"


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def write_sample_corpus(root: Path, *, docs: int = 60, seed: int = 0) -> list[Path]:
    """Write about `docs` articles under `root`; returns their paths (sorted)."""
    world = build_world(docs, seed)
    rng = random.Random(f"sample-formats:{seed}")
    paths = []
    groups = [("towns", world.towns, _town), ("people", world.people, _person),
              ("institutes", world.institutes, _institute), ("rivers", world.rivers, _river)]  # fmt: skip
    for folder, entities, render in groups:
        for entity in entities:
            title, sections = render(entity, world)
            kind = rng.choices(["md", "html", "txt"], weights=[8, 1, 1])[0]
            path = root / folder / f"{_slug(title)}.{kind}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_render(title, sections, kind), encoding="utf-8")
            paths.append(path)
    return sorted(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--docs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    paths = write_sample_corpus(args.root, docs=args.docs, seed=args.seed)
    print(f"wrote {len(paths)} documents under {args.root}")


if __name__ == "__main__":
    main()
