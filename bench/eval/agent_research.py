"""The research family: a research agent reading the web: search results as JSON, pages of prose with hedged truths and confident distractors."""
from __future__ import annotations

import json
import random
import re
from typing import List

from . import agent_outputs as fmt
from .agent_draft import Draft, plan, shared, write_steps
from .episode import Episode, Size, Step, tool


PLACE_A = ["Harrow", "Ashby", "Kelling", "Marston", "Wyre", "Brannock", "Fennick", "Calder", "Thursby", "Oldwick"]
PLACE_B = ["mere Fen", "dale Marshes", " Levels", "ford Estuary", " Moss", "wick Water"]
COUNTIES = ["Westmarch", "Eastholm", "Northcombe", "Southfold", "Lowmoor", "Highcross"]
AUTHORS = ["Penhallow", "Ashdown", "Marwood", "Trevelyan", "Oakeshott", "Caldicott", "Fairbairn", "Wexcombe",
           "Quennell", "Stanbury", "Ravenhill", "Tregear", "Kettleby", "Sowerby", "Latchford", "Brackenbury"]
PEOPLE = ["Ruth Ellery", "Tom Pryor", "Sanjay Mehta", "Claire Dunmore", "Owen Hollis", "Mags Latimer",
          "Peter Blackmore", "Ines Duarte", "Kwame Asante", "Hannah Yeo"]
FIRST = ["Alice", "Martin", "Helen", "Rupert", "Joanna", "Farid", "Eleanor", "Gareth"]
OFFICE = "National Statistics Office"
# metric name, how a value is written, a value
METRICS = [("peak count of wintering waterbirds", "{:,} birds", lambda r: r.randint(5200, 61000)),
           ("number of annual visitors", "{:,} visitors", lambda r: r.randint(18500, 96000)),
           ("total restoration cost", "£{:.2f} million", lambda r: r.randint(121, 989) / 100),
           ("area of reedbed", "{:.1f} hectares", lambda r: r.randint(601, 8990) / 10),
           ("mean phosphate concentration", "{:.3f} mg/l", lambda r: r.randint(21, 290) / 1000),
           ("number of volunteer hours logged", "{:,} hours", lambda r: r.randint(1210, 19800))]
HEDGES = ["roughly", "about", "an estimated", "around", "more than", "close to", "nearly"]
LOW_SOURCES = [("fenwalker.blog", "Fen Walker"), ("wildweekends.co", "Wild Weekends"),
               ("birdingforum.net", "Birding Forum"), ("localfacts.info", "Local Facts")]
FILLER = [
    "{place} sits on the floodplain of the River {river}, about {n} kilometres from the coast.",
    "The site was drained for grazing in the nineteenth century and rewetting began in {year}.",
    "Volunteers from the {trust} carry out monthly counts along the {n}-kilometre boardwalk.",
    "Local accounts put the {metric} at {hedged}, though the methodology is not described.",
    "According to a {year} leaflet, the {metric} was {hedged} at the time.",
    "The {council} has described the project as one of the largest of its kind in {county}.",
    "Heavy rain in the winter of {year} flooded the lower hides for several weeks.",
    "{person}, who has walked the reserve for decades, remembers when the reeds were cut by hand.",
    "Access is from the car park on Mill Lane; the main trail is step-free for the first kilometre.",
    "Funding came partly from a heritage grant and partly from water-company mitigation payments.",
    "Scrub clearance is done in autumn to avoid the breeding season.",
    "Several figures circulate online; some appear to be copied from older pages without a date.",
    "The {trust} publishes its survey results each spring, usually with a short methods note.",
    "A {year} estimate suggested {hedged}, but the authors cautioned that coverage was incomplete.",
    "Water levels are managed with a series of sluices installed during the first phase of works.",
    "Grazing by a small herd of Konik ponies keeps the wet meadows open.",
    "Visitor surveys run on a sample of weekends and are scaled up, so totals are approximate.",
    "The management plan runs until {later} and is reviewed every five years.",
    "{person} of the {trust} said the results were encouraging but that one good year proves little.",
    "Some older guides still describe the site as closed in winter, which has not been true since {year}.",
    "Bird hides were rebuilt in {year} after the old ones were damaged by fire.",
    "The {council} owns the southern half of the site; the {trust} leases the rest.",
    "Guided walks leave the visitor hub at ten on Saturdays from April to September.",
    "A {year} newsletter gave {hedged} for the {metric}, without saying how it was measured.",
    "{person} told a local paper that the {metric} was {hedged}, a number repeated on several websites since.",
    "Dogs are allowed on the perimeter path only, and must be kept on a short lead.",
    "The reedbed is cut on a seven-year rotation so that some stands are always mature.",
    "Otters returned to the main channel in {year}, the first confirmed record for decades.",
    "The nearest railway station is {n} kilometres away, with a bus on weekdays only.",
    "A second phase of works, costing a further sum that was never published, ended in {year}.",
    "Monitoring methods changed in {year}, so earlier and later figures are not strictly comparable.",
    "School groups visit throughout the year, and the education room can be booked in advance.",
    "Some of the wettest fields are still privately owned and are not open to the public.",
    "The site is designated as a Site of Special Scientific Interest and a Ramsar wetland.",
    "Car parking charges were introduced in {year}; members of the {trust} park free.",
]


def build_research(rng: random.Random, seed: int, size: Size) -> Episode:
    d = Draft(rng, size)
    n = size.sub_goals
    place = rng.choice(PLACE_A) + rng.choice(PLACE_B)
    county = rng.choice(COUNTIES)
    trust, council = f"{place.split()[0]} Wetlands Trust", f"{county} County Council"
    slug = place.lower().replace(" ", "-")
    shuffled = rng.sample(METRICS, len(METRICS))
    metrics = [shuffled[g % len(shuffled)] for g in range(n)]
    authors = rng.sample(AUTHORS, len(AUTHORS))
    rate = f"1.1{rng.randint(10, 99)}{rng.randint(1, 9)}"
    used_urls: set = set()
    queries: set = set()

    def value(g):
        return metrics[g][1].format(metrics[g][2](rng))

    def number(text):          # "61,240 visitors" -> "61,240"; "£4.83 million" -> "4.83"
        return text.split()[0].lstrip("£")

    def asked_value(g):
        """A value to ask about: no trailing decimal zero (a reply of "407" must match, not need "407.0")."""
        while True:
            v = value(g)
            if not ("." in number(v) and number(v).endswith("0")):
                return v

    def hedged(g):
        return f"{rng.choice(HEDGES)} {value(g)}"

    def prose(g, short=False):
        """Paragraphs of two to four sentences (one or two on a short page); a page repeats a sentence only
        once it has used them all."""
        pool: List[str] = []
        while True:
            para = []
            for _ in range(rng.randint(1, 2) if short else rng.randint(2, 4)):
                if not pool:
                    pool = rng.sample(FILLER, len(FILLER))
                para.append(pool.pop().format(
                    place=place, river=rng.choice(["Wend", "Ouse", "Lark", "Brue"]), n=rng.randint(2, 14),
                    trust=trust, year=rng.randint(1998, 2019), later=rng.randint(2027, 2034), metric=metrics[g][0],
                    hedged=hedged(g), council=council, county=county, person=rng.choice(PEOPLE)))
            yield " ".join(para)

    def url(site, title):
        words = re.findall(r"[a-z0-9]+", title.lower())[:7]
        u = f"https://{site}/{rng.choice(['news', 'reports', 'posts', 'p'])}/{'-'.join(words)}"
        while u in used_urls:
            u += f"-{rng.randint(2, 9)}"
        used_urls.add(u)
        return u

    def fetched(g, site, title, budget, fact=None, after=2016):
        when = f"{rng.randint(after, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        u = url(site, title)
        return u, fmt.page(rng, [f"# {title}", f"{u} · published {when}"], prose(g, budget < 12), budget, fact)

    def results(g, query, official=None, k=None):
        k = (k or max(2, d.rows // 2 + 1)) - (official is not None)
        out = []
        for _ in range(k):
            site, name = rng.choice(LOW_SOURCES + [(f"www.{slug.split('-')[0]}wetlands.org.uk", trust),
                                                   (f"www.{county.lower()}.gov.uk", council),
                                                   ("en.wikipedia.org", "Wikipedia")])
            title = rng.choice([f"{place}: {metrics[g][0]}", f"Visiting {place} - {name}",
                                f"{place} restoration update", f"How many? {place} in numbers"])
            out.append({"title": title, "url": url(site, title), "snippet": rng.choice([
                f"... the {metrics[g][0]} at {place} is {hedged(g)}, according to volunteers ...",
                f"... {place} ({county}) ... {hedged(g)} ... updated {rng.randint(2012, 2023)} ...",
                f"... we were told the {metrics[g][0]} is {value(g)}, which seems about right ..."]),
                "date": f"{rng.randint(2012, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"})
        if official:
            title = f"{county} environment statistics {rng.randint(2021, 2024)}"
            out.insert(rng.randrange(len(out) + 1), {
                "title": title, "url": url("www.nso-statistics.org", title), "date": "2024-03-28",
                "snippet": f"... the {OFFICE}'s latest release puts the {metrics[g][0]} at {place} at {official} ..."})
        text = json.dumps(out, indent=2, ensure_ascii=False) if rng.random() < 0.5 else fmt.layered_json(out, 1)
        return {"query": query}, text, out

    def search(g, place_, say):
        rule = None
        official = None
        if place_:
            official = asked_value(g)
            rule = rng.choice([f"If sources disagree on a figure, go with the {OFFICE}'s number; blogs and forums "
                               "don't count.", f"Where the numbers conflict, the {OFFICE} figure wins. Use that one."])
            d.ask(place_, f"Applying my rule for conflicting sources, what figure for the {metrics[g][0]} at "
                  f"{place} should the briefing use?", number(official))
        args, text, out = results(g, f"{place} {metrics[g][0]}" + (f" {2024 - g}" if g >= len(METRICS) else ""),
                                  official)
        low = [r for r in out if any(s in r["url"] for s, _ in LOW_SOURCES)]
        return Step(g, "web_search", args, text, user=rule,
                    say=f"{len(out)} results, {len(low)} of them blogs or forums; opening the better sources." if say
                    else None)

    def search2(g, place_, say):
        query = f"{place} {metrics[g][0]} {rng.choice(['report', 'official', 'survey'])} {rng.randint(2019, 2024)}"
        while query in queries:
            query += " pdf"
        queries.add(query)
        args, text, _ = results(g, query, k=max(2, d.rows // 3 + 1))
        return Step(g, "web_search", args, text,
                    say="The refined search mostly repeats the same pages." if say else None)

    def page(g, place_, say):
        site, title = rng.choice([("en.wikipedia.org", f"{place} - Wikipedia"),
                                  (f"www.{slug}.org.uk", f"About {place}"),
                                  (f"www.visit-{county.lower()}.com", f"{place} nature reserve guide")])
        u, text = fetched(g, site, title, d.medium())
        return Step(g, "fetch_page", {"url": u}, text,
                    say="Background only; no dated figure on this page." if say else None)

    def blog(g, place_, say):
        site, name = rng.choice(LOW_SOURCES)
        v = value(g)
        title = rng.choice([f"My day out at {place}", f"{place}: everything you need to know",
                            f"Is {place} worth a visit?"])
        u, text = fetched(g, site, title, d.medium(), f"For the record, the {metrics[g][0]} is {v}. I checked with "
                          "a warden, so you can take that to the bank.")
        return Step(g, "fetch_page", {"url": u}, text,
                    say=f"{name} states {v} with total confidence but cites a conversation, not a source." if say
                    else None)

    def forum(g, place_, say):
        site = rng.choice(LOW_SOURCES)[0]
        title = f"Re: {metrics[g][0]} at {place}?"
        u = url(site, title)
        posts = []
        for _ in range(max(2, d.rows // 3 + 1)):
            who = rng.choice(["wader_watcher", "fenland_phil", "reedbunting77", "moss_ranger", "tern_again"])
            posts += ["", f"{who} wrote ({rng.randint(1, 28)} {rng.choice(['Mar', 'Jun', 'Oct'])} "
                      f"{rng.randint(2014, 2023)}):", rng.choice([
                          f"Last I heard it was {hedged(g)}, but don't quote me.",
                          f"The trust's leaflet says {value(g)}. Might be out of date.",
                          f"Pretty sure it's {value(g)}, my cousin volunteers there.",
                          "Does anyone have the actual report? Everything online seems to copy everything else."])]
        return Step(g, "fetch_page", {"url": u}, "\n".join([f"# {title}", u] + posts),
                    say="The forum thread is hearsay; several posters contradict each other." if say else None)

    def report(g, place_, say):
        year, who = rng.randint(2019, 2023), authors.pop()
        d.ask(place_, f"Who compiled the {trust}'s {year} report on the {metrics[g][0]} at {place}? "
              "Give the surname.", who)
        fact = (f"The {year} report was compiled by Dr {rng.choice(FIRST)} {who} of the {trust}, who led the "
                f"fieldwork with a team of {rng.randint(8, 40)} volunteers and checked the counts twice.")
        u, text = fetched(g, f"www.{slug}.org.uk", f"{year} monitoring report | {trust}", d.long(), fact, year)
        return Step(g, "fetch_page", {"url": u}, text,
                    say="This is the trust's own report, with a methods section; the most careful source so far."
                    if say else None)

    def change(g, place_, say):
        y1, y2 = rng.randint(2010, 2015), rng.randint(2019, 2023)
        while True:         # a rise of 10% to 200%, stated with a non-zero decimal
            a, b = metrics[g][2](rng), metrics[g][2](rng)
            pct = f"{(b - a) * 100 / a:.1f}"
            if 1.1 * a < b < 3 * a and not pct.endswith("0"):
                break
        d.ask("assistant", f"By what percentage did you calculate that the {metrics[g][0]} at {place} rose between "
              f"{y1} and {y2}?", pct, "say")
        fa, fb = metrics[g][1].format(a), metrics[g][1].format(b)
        fact = (f"The survey series shows the change clearly: in {y1} the figure was {fa}, and by {y2} it had "
                f"reached {fb}.")
        u, text = fetched(g, f"www.{county.lower()}.gov.uk", f"{place}: ten years of monitoring", d.long(), fact,
                          y2)
        return Step(g, "fetch_page", {"url": u}, text,
                    say=f"From {fa} in {y1} to {fb} in {y2}: a rise of {pct}%. I'll quote the change, not one year.")

    def audit(g, place_, say):
        year, v = rng.randint(2020, 2023), asked_value(g)
        d.ask(place_, f"What audited figure for the {metrics[g][0]} in {year} did the {council} page give?", number(v))
        fact = (f"The audited figure for {year} is {v}. It supersedes the provisional estimate published earlier, "
                "which had been quoted in several news stories.")
        u, text = fetched(g, f"www.{county.lower()}.gov.uk", f"{place}: audited figures", d.long(), fact, year + 1)
        return Step(g, "fetch_page", {"url": u}, text,
                    say="An official page with audited figures; it explains why older estimates differ." if say
                    else None)

    def news(g, place_, say):
        ref = f"{rng.randint(19, 24)}/{rng.randint(10000, 99999):05d}/FUL"
        d.ask(place_, f"What is the reference of the planning application for the new visitor centre at {place}?",
              ref)
        fact = (f"A planning application (reference {ref}) for a new visitor centre was submitted to the {council} "
                "in the spring; a decision is expected after the consultation closes.")
        u, text = fetched(g, f"www.{county.lower()}courier.co.uk", f"Plans lodged for {place} visitor centre",
                          d.medium(), fact)
        return Step(g, "fetch_page", {"url": u}, text,
                    say="The news story is recent and names the applicant; useful for the outlook section." if say
                    else None)

    def opener(g):
        return rng.choice([f"Next for the briefing: the {metrics[g][0]}.",
                           f"Now the {metrics[g][0]}, please, and how reliable it is.",
                           f"Moving on: the {metrics[g][0]}. Check more than one source."])

    def user_fact(g):
        d.ask("user", "What GBP-to-EUR exchange rate did I tell you to use?", rate, "user")
        return (f"One more thing: the briefing goes to our Brussels office, so convert any GBP amounts to EUR at "
                f"{rate}, the rate finance gave us.")

    plans = plan(size, [("report", "middle"), ("change", "assistant"), ("search", "json"), ("audit", "middle"),
                         ("user", "user")], "news", head=["search"],
                  fillers=["page", "blog", "search2", "forum", "page", "blog", "page"], tail=[],
                  order=["page", "report", "blog", "forum", "change", "search2", "audit", "news"])
    makers = dict(search=search, search2=search2, page=page, blog=blog, forum=forum, report=report, change=change,
                  audit=audit, news=news)
    write_steps(d, plans, makers, opener, user_fact)
    task = (f"I'm writing a briefing on {place} in {county} for the regional nature partnership. Using web "
            f"search, establish: {'; '.join('the ' + metrics[g][0] for g in range(n))}. Many figures online are "
            "outdated or unsourced, so keep track of where each number comes from.")
    return Episode("research", seed, shared()[1], task,
                   [tool("web_search", "Search the web; returns a JSON list of results.", query="string"),
                    tool("fetch_page", "Fetch a web page as text.", url="string")], d.steps, d.questions, d.facts)
