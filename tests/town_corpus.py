"""A plain corpus of short Markdown town articles, written by a seeded generator (a test fixture).

Each document describes one invented town: its founding year and founder, its main export, the
canal it lies on, its town hall (year, architect, style) and its last census. The facts are
drawn from shared pools — a canal passes several towns, an architect designed several town
halls, an export is made in many places — as in a real gazetteer, so questions can join two
articles. Every fact has several phrasings and every article one of several layouts (sections or
none, different section names and orders, filler sentences), so the corpus is not one template
filled 200 times. `write_corpus` returns the facts, so a test can check an answer against them.

Run ``python tests/town_corpus.py DIR`` to write it for a manual `gymflow dataset generate`.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path


def _words(text: str, sep: str | None = None) -> list[str]:
    return text.split(sep)


_PREFIXES = _words(
    "Ash Brel Cor Dun Elm Fen Gar Hol Irn Kel Lang Mar Nor Oak Pel Quen Ros Stan Thorn Ul Vel Wex Yar Zell Bram "
    "Cal Dray Esk From Glen Hart Kirk Lor Mel Nant Penn Rad Sel Tarn Wick"
)
_SUFFIXES = _words("by ford ham wick mere stead holt bury dale thorpe ness field ton well more gate combe ley stow")
_CANALS = _words(
    "Veller Gresham Kessel Lindow Marrow Ostler Pardue Rundell Saltash Tamber Wendle Yoxall Brindle Carrow Dunmore "
    "Ebbing Fairleigh Gowan Islip Juniper Abbot Coldwater"
)
_FIRST = _words(
    "Hanna Tomas Sofia Edmund Ines Walter Clara Osric Mira Jonas Agnes Piet Rosalind Bertil Elsa Conrad Greta Anselm "
    "Liesel Hugo Maud Viktor Alma Lucian Ottilie Felix Signe Rainer Ida Gideon"
)
_FOUNDER_LAST = _words(
    "Halden Sorel Marwick Tennant Aldous Brockley Fairbairn Gillam Hensley Ingram Jessop Kettering Lowther Mabry "
    "Norcott Orwin Prideaux Quarles Redvers Stainton Thackery Upcott Vosper Waddell Yelland"
)
_ARCHITECT_LAST = _words("Holt Varga Lindqvist Okafor Castellan Brunel Dobrev Hallam Petit Rasmussen Serrano Thorne")
_EXPORTS = _words(
    "wool|salt|timber|barley|pottery|glassware|cider|linen|tin|leather|cheese|rope|slate|hops|paper|bricks|"
    "copper wire|clocks|lace|soap|oats|smoked herring|flax|iron nails|candles|tiles|furniture|malt",
    "|",
)
_STYLES = ("Gothic Revival", "Baroque", "Neoclassical", "Tudor Revival", "Art Deco", "Georgian", "Romanesque Revival")
_REGIONS = ("northern", "southern", "eastern", "western", "upland", "coastal")
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_SAINTS = ("Aidan", "Brigid", "Cuthbert", "Wilfrid", "Oswald", "Hilda", "Chad", "Bede")
_FEATURES = ("a tall spire", "a Norman doorway", "a painted rood screen", "a ring of eight bells", "a squat tower")

_FOUNDING = (
    "{name} was founded in {founded} by {founder}.",
    "The settlement dates from {founded}, when {founder} was granted a charter to hold a market there.",
    "Records place the founding of {name} in {founded}; its first charter names {founder} as lord of the manor.",
    "Founded in {founded} by {founder}, {name} grew up around a ford used by drovers.",
    "{founder} established the town in {founded}.",
    "The first written mention of {name} is a deed of {founded} signed by {founder}, its founder.",
)
_EXPORT = (
    "Its main export is {export}.",
    "The economy of {name} rests on the export of {export}.",
    "Most of the goods shipped out of the town are {export}.",
    "{name} is best known for its {export}, most of which is sold abroad.",
    "The chief product sent from its wharves is {export}.",
    "Local workshops turn out {export}, the town's principal export.",
)
_CANAL = (
    "{name} lies on the {canal}.",
    "The {canal} runs through the middle of the town.",
    "Barges reach {name} by way of the {canal}.",
    "The town grew along the towpath of the {canal}.",
    "A lock on the {canal} sits just below the market square of {name}.",
)
_HALL = (
    "The town hall was completed in {hall_year} to designs by {architect}.",
    "{architect} designed the {style} town hall, which opened in {hall_year}.",
    "Its town hall, {a_style} building by {architect}, dates from {hall_year}.",
    "The present town hall replaced a timber market house in {hall_year}; the architect was {architect}.",
    "In {hall_year} the council moved into a new {style} town hall planned by {architect}.",
)
_CENSUS = (
    "At the {census_year} census the town had {population} inhabitants.",
    "The population was {population} at the census of {census_year}.",
    "The {census_year} census counted {population} residents in {households} households.",
    "{name} had {population} people at the last census, taken in {census_year}.",
    "Census returns for {census_year} record a population of {population}.",
)
_TWIN = ("{name} is twinned with {twin}.", "Since {twin_year} the town has been twinned with {twin}.")
_FILLER = (
    "A market is held every {weekday}.",
    "The parish church of St {saint} has {feature}.",
    "A weekly market has been held on {weekday}s since the Middle Ages.",
    "Its grammar school was endowed by a wool merchant.",
    "The old bridge was rebuilt in stone after a flood.",
    "Several almshouses survive near the church of St {saint}.",
)
# Layouts: (section heading or None, facts in it); None sections make a document without headings.
_LAYOUTS: tuple[tuple[tuple[str | None, tuple[str, ...]], ...], ...] = (
    (("History", ("founding", "twin")), ("Economy", ("export",)), ("Waterways", ("canal",)),
     ("Town hall", ("hall",)), ("Population", ("census",))),
    (("Overview", ("canal", "census", "filler")), ("History", ("founding", "hall")), ("Economy", ("export", "twin"))),
    ((None, ("founding", "canal", "filler")), (None, ("export", "census")), (None, ("hall", "twin"))),
    (("Geography", ("canal", "filler")), ("Civic buildings", ("hall", "filler")), ("Trade", ("export",)),
     ("Demographics", ("census",)), ("History", ("founding", "twin"))),
)  # fmt: skip


@dataclass(frozen=True)
class Town:
    """The facts of one article (what a generated question about it may be checked against)."""

    name: str
    path: str
    region: str
    founded: int
    founder: str
    export: str
    canal: str
    hall_year: int
    architect: str
    style: str
    census_year: int
    population: int
    households: int
    twin: str | None


def towns(n: int = 200, *, seed: int = 31) -> list[Town]:
    """`n` towns with their facts (deterministic for a seed)."""
    rng = random.Random(seed)
    names = rng.sample([p + s for p in _PREFIXES for s in _SUFFIXES], n)
    canals = [f"{c} Canal" for c in rng.sample(_CANALS, min(len(_CANALS), max(2, n // 8)))]
    architects = [f"{f} {a}" for f in _FIRST for a in _ARCHITECT_LAST]
    architects = rng.sample(architects, max(2, n // 3))
    founders = rng.sample([f"{f} {last}" for f in _FIRST for last in _FOUNDER_LAST], n)
    out: list[Town] = []
    for i, name in enumerate(names):
        founded = rng.randint(1080, 1820)
        hall_year = min(founded + rng.randint(60, 420), 1965)
        population = int(rng.lognormvariate(8.7, 0.8)) + 400
        out.append(
            Town(
                name=name,
                path=f"{name.lower()}.md",
                region=rng.choice(_REGIONS),
                founded=founded,
                founder=founders[i],
                export=rng.choice(_EXPORTS),
                canal=rng.choice(canals),
                hall_year=hall_year,
                architect=rng.choice(architects),
                style=rng.choice(_STYLES),
                census_year=rng.choice((1991, 2001, 2011, 2021)),
                population=population,
                households=max(population // rng.randint(2, 4), 1),
                twin=None,
            )
        )
    # Twinning links about a third of the towns in pairs, named in both articles.
    partners = rng.sample(range(n), (n // 3) // 2 * 2)
    twins = {out[a].name: out[b].name for a, b in zip(partners[::2], partners[1::2], strict=True)}
    twins |= {b: a for a, b in twins.items()}
    return [Town(**{**t.__dict__, "twin": twins.get(t.name)}) for t in out]


def _number(value: int) -> str:
    return f"{value:,}"


def article(town: Town, *, seed: int = 31, flat: bool = False) -> str:
    """The Markdown article of one town (`flat`: paragraphs under its title, no sections)."""
    rng = random.Random(f"{seed}:{town.name}")
    values = {
        **town.__dict__,
        "population": _number(town.population),
        "households": _number(town.households),
        "twin_year": rng.randint(1950, 1995),
        "weekday": rng.choice(_WEEKDAYS),
        "saint": rng.choice(_SAINTS),
        "feature": rng.choice(_FEATURES),
        "a_style": ("an " if town.style[0] in "AEIOU" else "a ") + town.style,
    }
    pools = {"founding": _FOUNDING, "export": _EXPORT, "canal": _CANAL, "hall": _HALL, "census": _CENSUS}
    lines = [f"# {town.name}", ""]
    intro = f"{town.name} is a market town in the {town.region} part of the county."
    layout = rng.choice(_LAYOUTS)
    for number, (heading, facts) in enumerate(layout):
        sentences = [intro] if number == 0 else []
        for fact in facts:
            if fact == "twin":
                if town.twin:
                    sentences.append(rng.choice(_TWIN).format(**values))
            elif fact == "filler":
                sentences.append(rng.choice(_FILLER).format(**values))
            else:
                sentences.append(rng.choice(pools[fact]).format(**values))
        if heading and not flat:
            lines += [f"## {heading}", ""]
        lines += [" ".join(sentences), ""]
    return "\n".join(lines)


def write_corpus(root: Path, n: int = 200, *, seed: int = 31, flat: bool = False) -> list[Town]:
    """Write `n` articles under `root` (one ``<town>.md`` each); returns their facts.

    Args:
        root: The corpus directory (created).
        n: Towns.
        seed: Seed of the facts and the wording.
        flat: No sections: every article is one passage, as short encyclopedia stubs are.
    """
    root.mkdir(parents=True, exist_ok=True)
    facts = towns(n, seed=seed)
    for town in facts:
        (root / town.path).write_text(article(town, seed=seed, flat=flat), encoding="utf-8")
    return facts


if __name__ == "__main__":
    write_corpus(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 200, flat="--flat" in sys.argv)
