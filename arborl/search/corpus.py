"""A seeded generator of a Search-R1-style corpus and QA set about fictional entities (no downloads).

The world: countries, cities (each in a country, with a founding year), people (born in a city,
in a year) and companies (founded in a year by a person, headquartered in a city, run by a CEO who
is another person). Each entity has one passage. Every name token is unique across the world, so a
query that names an entity finds its passage.

Questions are 1-hop (the answer is in the subject's passage), 2-hop (the subject's passage names
a *bridge* entity, e.g. the founder, and the answer is in the bridge's passage) or 3-hop (a chain
of two bridges: company -> founder or CEO -> birth city -> its country or founding year, person ->
birth city -> country -> capital; ``three_hop_frac``, 0 by default). The generator keeps multi-hop questions
honest:

* no bridge is named in the question, so each later query has to use what the search before it
  returned (``oracle_queries[i + 1]`` contains ``bridge_answers[i]``);
* no passage before the last hop's contains the final answer: a person's passage names the
  birth city but no country; a company's headquarters city is never its founder's or CEO's
  birth city; years of different kinds (cities < 1900, births 1925-1995, companies >= 1950 and
  >= founder's birth + 22) never coincide; a capital question is asked only of a city (or of a
  person born in a city) that is not itself the capital, and not of a person whose company is
  headquartered in that capital.

Held-out split: a question is ``"test"`` when a hash of its subject's passage id falls in the
held-out fraction, so train and test questions are about disjoint subjects (a test subject may
still appear as a bridge in a train question).

    python -m arborl.search.corpus OUT_DIR [--seed 0] [--three-hop 0.3]    # writes corpus.jsonl and qa.jsonl
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from arborl.config import ConfigError
from arborl.env import split
from arborl.search.formats import Passage, Question, write_jsonl

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t",
           "th", "v", "z", "sh", "c", "j"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "m", "th", "rd", "sk"]
_FIRST = ["Talia", "Oren", "Mirela", "Caspian", "Ysolde", "Bram", "Linnea", "Tobiah", "Sefa", "Idris",
          "Marit", "Anselm", "Priya", "Joren", "Kalinda", "Ewan", "Odile", "Rafe", "Noor", "Teodor",
          "Vesna", "Hollis", "Amara", "Leif", "Sunniva", "Dario", "Ilse", "Mateo", "Rhoswen", "Kasimir"]
_OCCUPATIONS = ["engineer", "painter", "economist", "architect", "chemist", "novelist", "surgeon",
                "composer", "mathematician", "historian", "sculptor", "geologist", "diplomat", "botanist"]
_INDUSTRIES = ["software", "shipping", "textile", "pharmaceutical", "aerospace", "food processing",
               "mining", "insurance", "robotics", "publishing", "telecommunications", "glassware"]
_SUFFIXES = ["Systems", "Industries", "Holdings", "Works", "Dynamics", "Labs", "Group", "Foundry"]
_TRAITS = ["its covered markets", "a long stone bridge", "spring flower fairs", "its old observatory",
           "narrow canal streets", "a lively harbour", "terraced vineyards", "a famous clock tower"]
_KNOWN = ["careful, patient work", "a series of public lectures", "several award-winning projects",
          "mentoring young colleagues", "an unusual working method", "essays on craft and practice"]


@dataclass(frozen=True)
class CorpusConfig:
    """How big the generated world and QA set are.

    The defaults give 10,060 passages (60 countries, 1,000 cities, 5,400 people, 3,600 companies).
    """

    seed: int = 0
    """Seed of the generator: the same seed gives byte-identical files."""
    n_countries: int = 60
    n_cities: int = 1000
    n_people: int = 5400
    n_companies: int = 3600
    n_questions: int = 3000
    """Questions generated (distinct subject and kind), before the split."""
    two_hop_frac: float = 0.6
    """Fraction of the questions that need two searches."""
    three_hop_frac: float = 0.0
    """Fraction of the questions that need three searches (the rest, 1 - two - three, need one).
    0 draws exactly the questions of earlier versions for the same seed."""
    test_frac: float = 0.2
    """Fraction of subjects (by hash of their passage id) whose questions are held out."""
    filler: bool = True
    """False: each passage holds only the facts a question asks about (no city trait, occupation,
    known-for, language or industry), so a reader has fewer words to pass over. The world and the
    questions are the same either way."""

    def __post_init__(self) -> None:
        if self.n_countries < 2 or self.n_cities < self.n_countries:
            raise ConfigError("corpus: need n_countries >= 2 and n_cities >= n_countries (every country has a capital)")
        if self.n_people < 4 or self.n_companies < 1:
            raise ConfigError("corpus: need n_people >= 4 and n_companies >= 1")
        if not (0.0 <= self.two_hop_frac <= 1.0 and 0.0 <= self.test_frac < 1.0):
            raise ConfigError("corpus: two_hop_frac must be in [0, 1] and test_frac in [0, 1)")
        if not (self.three_hop_frac >= 0.0 and self.two_hop_frac + self.three_hop_frac <= 1.0):
            raise ConfigError(f"corpus: three_hop_frac = {self.three_hop_frac} with two_hop_frac = {self.two_hop_frac}; "
                              "each must be >= 0 and their sum <= 1 (the rest are 1-hop questions)")
        if self.n_questions < 1:
            raise ConfigError("corpus: n_questions must be >= 1")


@dataclass(frozen=True)
class Country:
    """A country: its passage names its capital (city index ``capital``) and language."""

    pid: str
    name: str
    capital: int
    language: str


@dataclass(frozen=True)
class City:
    """A city in ``country`` (an index into ``World.countries``), founded in ``founded``."""

    pid: str
    name: str
    country: int
    founded: int
    trait: str


@dataclass(frozen=True)
class Person:
    """A person born in year ``born`` in city ``city``; ``pid`` is the passage id."""

    pid: str
    name: str
    born: int
    city: int
    occupation: str
    pronoun: str
    known_for: str


@dataclass(frozen=True)
class Company:
    """A company founded by person ``founder``, run by person ``ceo``, headquartered in city ``hq``."""

    pid: str
    name: str
    industry: str
    founded: int
    founder: int
    ceo: int
    hq: int


@dataclass(frozen=True)
class World:
    """Every entity of a generated world, indexed as the relations refer to them."""

    countries: list[Country]
    cities: list[City]
    people: list[Person]
    companies: list[Company]


class _Names:
    """Fresh capitalised words, none used twice in a world."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, {w.lower() for w in _FIRST + _SUFFIXES}

    def word(self, syllables: int = 2, suffix: str = "") -> str:
        """A new word of ``syllables`` syllables (more once those run out) ending in ``suffix``."""
        for attempt in range(10**6):
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                        for _ in range(syllables + attempt // 100)) + suffix
            if w not in self.used and len(w) >= 4:
                self.used.add(w)
                return w.capitalize()
        raise ConfigError("corpus: ran out of fresh names; lower the entity counts")


def build_world(cfg: CorpusConfig) -> World:
    """Draw the entities and their relations from ``cfg.seed``."""
    rng = random.Random(cfg.seed)
    names = _Names(rng)
    pid = iter(f"p{i:05d}" for i in range(10**6))
    country_names = [names.word(1, rng.choice(["ia", "land", "istan", "ara", "ovia"])) for _ in range(cfg.n_countries)]
    city_country = list(range(cfg.n_countries)) + [rng.randrange(cfg.n_countries)
                                                   for _ in range(cfg.n_cities - cfg.n_countries)]
    countries = [Country(next(pid), n, capital=i, language=n[:-2] + "ian" if n.endswith("ia") else n + "ish")
                 for i, n in enumerate(country_names)]  # city i is the capital of country i
    cities = [City(next(pid), names.word(), country=c, founded=rng.randint(900, 1880), trait=rng.choice(_TRAITS))
              for c in city_country]
    people = [Person(next(pid), f"{rng.choice(_FIRST)} {names.word(rng.choice([2, 3]))}", born=rng.randint(1925, 1995),
                     city=rng.randrange(cfg.n_cities), occupation=rng.choice(_OCCUPATIONS),
                     pronoun=rng.choice(["She", "He"]), known_for=rng.choice(_KNOWN)) for _ in range(cfg.n_people)]
    companies = []
    for _ in range(cfg.n_companies):
        founder, ceo = rng.sample(range(cfg.n_people), 2)
        # headquarters never in the founder's or CEO's birth city: the company passage must not
        # hold the answer of "where was the founder/CEO of X born?"
        banned = {people[founder].city, people[ceo].city}
        hq = rng.choice([c for c in rng.sample(range(cfg.n_cities), 3) if c not in banned])
        founded = rng.randint(max(1950, people[founder].born + 22), 2024)
        companies.append(Company(next(pid), f"{names.word()} {rng.choice(_SUFFIXES)}", rng.choice(_INDUSTRIES),
                                 founded, founder, ceo, hq))
    return World(countries, cities, people, companies)


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def world_passages(world: World, filler: bool = True) -> list[Passage]:
    """One passage per entity; relations are written by name, countries only in city passages.

    ``filler=False`` writes only the sentences a question asks about (see ``CorpusConfig.filler``).
    """
    if not filler:
        return _short_passages(world)
    out = [Passage(c.pid, c.name, f"{c.name} is a country. Its capital is {world.cities[c.capital].name}. "
                   f"The official language of {c.name} is {c.language}.") for c in world.countries]
    out += [Passage(c.pid, c.name, f"{c.name} is a city located in {world.countries[c.country].name}. "
                    f"{c.name} was founded in {c.founded}. The city is known for {c.trait}.") for c in world.cities]
    out += [Passage(p.pid, p.name, f"{p.name} (born {p.born}) is {_a(p.occupation)}. {p.pronoun} was born in {world.cities[p.city].name}. "
                    f"{p.name.split()[-1]} is known for {p.known_for}.") for p in world.people]
    out += [Passage(c.pid, c.name, f"{c.name} is {_a(c.industry)} company founded in {c.founded} by "
                    f"{world.people[c.founder].name}. It is headquartered in {world.cities[c.hq].name}. "
                    f"The chief executive officer (CEO) of {c.name} is {world.people[c.ceo].name}.")
            for c in world.companies]
    return out


def _short_passages(world: World) -> list[Passage]:
    """The passages without filler: only the facts the question kinds ask about."""
    out = [Passage(c.pid, c.name, f"{c.name} is a country. Its capital is {world.cities[c.capital].name}.")
           for c in world.countries]
    out += [Passage(c.pid, c.name, f"{c.name} is a city located in {world.countries[c.country].name}. "
                    f"{c.name} was founded in {c.founded}.") for c in world.cities]
    out += [Passage(p.pid, p.name, f"{p.name} was born in {world.cities[p.city].name} in {p.born}.")
            for p in world.people]
    out += [Passage(c.pid, c.name, f"{c.name} was founded in {c.founded} by {world.people[c.founder].name}. "
                    f"It is headquartered in {world.cities[c.hq].name}. The CEO of {c.name} is "
                    f"{world.people[c.ceo].name}.") for c in world.companies]
    return out


@dataclass(frozen=True)
class _Hop:
    query: str
    pid: str
    found: str  # what this hop's passage tells: the bridge (or the final answer, at the last hop)


def _kinds(w: World) -> dict[str, tuple[str, Callable[[int], tuple[str, list[_Hop]] | None]]]:
    """Question kinds: name -> (subject type, subject index -> (question, hops) or None)."""
    P, C, Y, N = w.people, w.cities, w.companies, w.countries

    def person_hop(i: int, found: str) -> _Hop:
        return _Hop(f"{P[i].name} born", P[i].pid, found)

    def city_hop(i: int, found: str) -> _Hop:
        return _Hop(f"{C[i].name} city", C[i].pid, found)

    def company_hop(i: int, word: str, found: str) -> _Hop:
        return _Hop(f"{Y[i].name} {word}", Y[i].pid, found)

    def capital(i: int) -> tuple[str, list[_Hop]] | None:
        country = N[C[i].country]
        if country.capital == i:
            return None
        return (f"What is the capital of the country where {C[i].name} is located?",
                [city_hop(i, country.name), country_hop(country, C[country.capital].name)])

    def country_hop(country: Country, found: str) -> _Hop:
        return _Hop(f"{country.name} country capital", country.pid, found)

    hqs: dict[int, set[int]] = {}  # person -> the headquarters of the companies whose passages name them
    for y in Y:
        hqs.setdefault(y.founder, set()).add(y.hq)
        hqs.setdefault(y.ceo, set()).add(y.hq)

    def birth_capital(i: int) -> tuple[str, list[_Hop]] | None:
        city = P[i].city
        country = N[C[city].country]
        if country.capital == city or country.capital in hqs.get(i, ()):  # a passage naming them names the answer
            return None
        return (f"What is the capital of the country where {P[i].name} was born?",
                [person_hop(i, C[city].name), city_hop(city, country.name), country_hop(country, C[country.capital].name)])

    def via_person(word: str, role: str, tail: str) -> Callable[[int], tuple[str, list[_Hop]]]:
        """3-hop: company -> its founder or CEO -> their birth city -> that city's country or founding year."""
        def build(i: int) -> tuple[str, list[_Hop]]:
            who = Y[i].founder if role == "founder" else Y[i].ceo
            city = P[who].city
            found = N[C[city].country].name if tail == "country" else str(C[city].founded)
            text = (f"In which country is the city where the {role} of {Y[i].name} was born?" if tail == "country"
                    else f"In which year was the city where the {role} of {Y[i].name} was born founded?")
            return text, [company_hop(i, word, P[who].name), person_hop(who, C[city].name), city_hop(city, found)]
        return build

    return {
        "person_birthplace": ("person", lambda i: (f"Where was {P[i].name} born?", [person_hop(i, C[P[i].city].name)])),
        "person_birthyear": ("person", lambda i: (f"In which year was {P[i].name} born?", [person_hop(i, str(P[i].born))])),
        "company_founded": ("company", lambda i: (f"In which year was {Y[i].name} founded?",
                                                  [company_hop(i, "founded", str(Y[i].founded))])),
        "company_founder": ("company", lambda i: (f"Who founded {Y[i].name}?",
                                                  [company_hop(i, "founded", P[Y[i].founder].name)])),
        "company_ceo": ("company", lambda i: (f"Who is the CEO of {Y[i].name}?", [company_hop(i, "CEO", P[Y[i].ceo].name)])),
        "company_hq": ("company", lambda i: (f"In which city is {Y[i].name} headquartered?",
                                             [company_hop(i, "headquartered", C[Y[i].hq].name)])),
        "city_country": ("city", lambda i: (f"In which country is {C[i].name} located?", [city_hop(i, N[C[i].country].name)])),
        "city_founded": ("city", lambda i: (f"In which year was the city of {C[i].name} founded?",
                                            [city_hop(i, str(C[i].founded))])),
        "person_birth_country": ("person", lambda i: (f"In which country is the city where {P[i].name} was born?", [
            person_hop(i, C[P[i].city].name), city_hop(P[i].city, N[C[P[i].city].country].name)])),
        "founder_birthplace": ("company", lambda i: (f"In which city was the founder of {Y[i].name} born?", [
            company_hop(i, "founded", P[Y[i].founder].name), person_hop(Y[i].founder, C[P[Y[i].founder].city].name)])),
        "founder_birthyear": ("company", lambda i: (f"In which year was the founder of {Y[i].name} born?", [
            company_hop(i, "founded", P[Y[i].founder].name), person_hop(Y[i].founder, str(P[Y[i].founder].born))])),
        "ceo_birthplace": ("company", lambda i: (f"Where was the CEO of {Y[i].name} born?", [
            company_hop(i, "CEO", P[Y[i].ceo].name), person_hop(Y[i].ceo, C[P[Y[i].ceo].city].name)])),
        "hq_country": ("company", lambda i: (f"In which country is {Y[i].name} headquartered?", [
            company_hop(i, "headquartered", C[Y[i].hq].name), city_hop(Y[i].hq, N[C[Y[i].hq].country].name)])),
        "hq_city_founded": ("company", lambda i: (f"In which year was the city where {Y[i].name} is headquartered founded?", [
            company_hop(i, "headquartered", C[Y[i].hq].name), city_hop(Y[i].hq, str(C[Y[i].hq].founded))])),
        "city_capital": ("city", capital),
        "founder_birth_country": ("company", via_person("founded", "founder", "country")),
        "ceo_birth_country": ("company", via_person("CEO", "CEO", "country")),
        "founder_birth_city_founded": ("company", via_person("founded", "founder", "year")),
        "ceo_birth_city_founded": ("company", via_person("CEO", "CEO", "year")),
        "person_birth_capital": ("person", birth_capital),
    }


def held_out(subject_pid: str, test_frac: float) -> bool:
    """Whether questions about ``subject_pid`` are held out (a stable hash, independent of the seed)."""
    return split.held_out(subject_pid, test_frac)


def make_questions(world: World, cfg: CorpusConfig) -> list[Question]:
    """Draw ``cfg.n_questions`` distinct (kind, subject) questions with oracle queries and a split."""
    rng = random.Random(cfg.seed + 1)
    kinds = _kinds(world)
    subjects = {"person": world.people, "city": world.cities, "company": world.companies}
    by_hops: dict[int, list[str]] = {1: [], 2: [], 3: []}
    for name, (stype, build) in kinds.items():
        probe = next((q for q in map(build, range(len(subjects[stype]))) if q is not None), None)
        if probe is not None:  # e.g. no city_capital question when every city is a capital
            by_hops[len(probe[1])].append(name)
    capacity = sum(len(subjects[s]) for s, _ in kinds.values())
    if cfg.n_questions > capacity // 2:
        raise ConfigError(f"corpus: n_questions = {cfg.n_questions} is too many for this world "
                          f"(at most {capacity // 2}); lower it or raise the entity counts")
    seen: set[tuple[str, int]] = set()
    out: list[Question] = []
    for _ in range(100 * cfg.n_questions):
        if len(out) == cfg.n_questions:
            break
        roll = rng.random()
        hops = 3 if roll < cfg.three_hop_frac else 2 if roll < cfg.three_hop_frac + cfg.two_hop_frac else 1
        kind = rng.choice(by_hops[hops])
        stype, build = kinds[kind]
        i = rng.randrange(len(subjects[stype]))
        built = build(i) if (kind, i) not in seen else None
        if built is None:
            continue
        seen.add((kind, i))
        text, hops = built
        subject = subjects[stype][i].pid
        out.append(Question(
            id=f"q{len(out):05d}", question=text, golden_answers=(hops[-1].found,), hops=len(hops),
            supporting_ids=tuple(h.pid for h in hops), oracle_queries=tuple(h.query for h in hops),
            bridge_answers=tuple(h.found for h in hops[:-1]),
            split="test" if held_out(subject, cfg.test_frac) else "train",
            extra={"kind": kind, "subject_id": subject}))
    if len(out) < cfg.n_questions:
        raise ConfigError(f"corpus: found only {len(out)} distinct questions of {cfg.n_questions}; "
                          "lower n_questions or raise the entity counts")
    return out


def generate(cfg: CorpusConfig | None = None) -> tuple[list[Passage], list[Question]]:
    """The passages and questions of the world drawn from ``cfg`` (defaults: 10,060 passages)."""
    cfg = cfg or CorpusConfig()
    world = build_world(cfg)
    return world_passages(world, cfg.filler), make_questions(world, cfg)


def write_dataset(out_dir: str | Path, cfg: CorpusConfig | None = None) -> tuple[Path, Path]:
    """Generate and write ``corpus.jsonl`` and ``qa.jsonl`` under ``out_dir``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    passages, questions = generate(cfg)
    write_jsonl(out / "corpus.jsonl", passages)
    write_jsonl(out / "qa.jsonl", questions)
    return out / "corpus.jsonl", out / "qa.jsonl"


def main(argv: list[str] | None = None) -> int:
    """``python -m arborl.search.corpus OUT_DIR [--seed N] [--questions N] [--two-hop F] [--three-hop F]``."""
    p = argparse.ArgumentParser(prog="python -m arborl.search.corpus", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--questions", type=int, default=CorpusConfig.n_questions)
    p.add_argument("--two-hop", type=float, default=CorpusConfig.two_hop_frac, help="share of 2-hop questions")
    p.add_argument("--three-hop", type=float, default=CorpusConfig.three_hop_frac, help="share of 3-hop questions")
    args = p.parse_args(argv)
    corpus, qa = write_dataset(args.out_dir, CorpusConfig(seed=args.seed, n_questions=args.questions,
                                                          two_hop_frac=args.two_hop, three_hop_frac=args.three_hop))
    print(f"wrote {corpus} and {qa}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
