"""The support family: a support agent working a ticket queue: ticket threads, order and account lookups as JSON, policy documents."""
from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from typing import List

from . import agent_outputs as fmt
from .agent_draft import Draft, plan, shared, write_steps
from .episode import Episode, Size, Step, tool


SHOPS = ["Brightwell Home", "Nordvik Appliances", "Casa Lumen"]
CUSTOMERS = ["Marta Kowalczyk", "Liam O'Brien", "Sofia Brandt", "Yusuf Demir", "Elena Rossi", "Henrik Lund",
             "Chloé Martin", "Daniel Novak", "Aisha Rahman", "Pieter de Vries", "Grace Okafor", "Lucas Moreau"]
AGENTS = ["Jonas (tier 1)", "Priya (tier 1)", "Marek (tier 2)", "Aoife (tier 1)", "Tomás (billing)"]
PRODUCTS = [("espresso machine", "Aurora 3", "AU3"), ("dishwasher", "Fjell 45", "FJ45"),
            ("air purifier", "Breeze Pro", "BZP"), ("stand mixer", "Kneda 6", "KN6"),
            ("robot vacuum", "Sweeply S2", "SWS2"), ("induction hob", "Calor 60", "CL60")]
PROBLEMS = ["arrived with a cracked water tank", "has not arrived although tracking says delivered",
            "was charged twice on my card", "stopped working after two weeks", "is the wrong model",
            "arrived without the power cable"]
CARRIERS = [("UPS", lambda r: "1Z" + "".join(r.choice("0123456789ABCDEFGHJKLMNPRSTVWXYZ") for _ in range(6))
             + "".join(r.choice("0123456789") for _ in range(10))),
            ("DHL", lambda r: "JD01" + "".join(r.choice("0123456789") for _ in range(16))),
            ("GLS", lambda r: "GLS" + "".join(r.choice("0123456789") for _ in range(11)))]
DETAILS = {"label_created": "Shipment information received", "picked_up": "Picked up from the sender's warehouse",
           "in_transit": "Departed from facility", "at_depot": "Arrived at the delivery depot",
           "out_for_delivery": "With the driver for delivery today"}
QUEUE_A = ["refund", "billing", "payments", "returns", "warranty", "logistics"]
QUEUE_B = ["approvals", "escalations", "review", "claims", "exceptions"]
QUEUE_C = ["emea", "tier2", "l2", "eu_west", "nordics"]


def build_support(rng: random.Random, seed: int, size: Size) -> Episode:
    d = Draft(rng, size)
    n = size.sub_goals
    shop = rng.choice(SHOPS)
    ids = rng.sample(range(40000, 99999), 6 * n + 16)
    tickets = [f"TCK-{i}" for i in ids[:n]]
    orders = [f"ORD-{i}" for i in ids[n:2 * n]]
    old_tickets = [f"TCK-{i - 30000}" for i in ids[2 * n:3 * n]]       # each customer's earlier ticket ...
    old_orders = [f"ORD-{i}" for i in ids[3 * n:4 * n]]                # ... about an earlier order
    spare_orders = [f"ORD-{i}" for i in ids[4 * n:]]
    accounts = [f"ACC-{rng.randint(100000, 999999)}" for _ in range(n)]
    people = rng.sample(CUSTOMERS, min(n, len(CUSTOMERS))) * 2
    products = [rng.choice(PRODUCTS) for _ in range(n)]
    problems = [rng.choice(PROBLEMS) for _ in range(n)]
    queues = rng.sample([f"{a}_{b}_{c}" for a in QUEUE_A for b in QUEUE_B for c in QUEUE_C], 12)
    approval_queue = next(q for q in queues if q.startswith(("refund", "billing", "payments")))
    queues.remove(approval_queue)
    deliver_after = f"{rng.randint(12, 17)}:{rng.choice(['15', '40', '45', '50'])}"
    policies_read: List[str] = []
    macros_read: List[str] = []

    def clock(start_day):
        """Increasing timestamps from a day in spring 2024 (a fixed calendar, not today's date)."""
        t = datetime(2024, 3, 1, 8, 0) + timedelta(days=start_day, minutes=rng.randint(0, 600))
        while True:
            yield t
            t += timedelta(minutes=rng.randint(25, 1900))

    def iso():
        return next(clock(rng.randint(0, 90))).strftime("%Y-%m-%dT%H:%M:%SZ")

    def as_json(obj):
        """indent=2 when it fits the line budget (half the time), else one record a line, else compact."""
        limit = 4 * d.rows + 10
        for text in ([json.dumps(obj, indent=2, ensure_ascii=False)] if rng.random() < 0.5 else []) + [
                fmt.layered_json(obj, 2), fmt.layered_json(obj, 1)]:
            if text.count("\n") < limit:
                return text
        return json.dumps(obj, ensure_ascii=False)

    def thread(g, tid, budget, product, problem, order_id, fact=None, status="open"):
        """A ticket thread of about ``budget`` lines; ``fact`` is a line the customer adds to a message in
        the middle of the thread."""
        name, (item, model, code) = people[g], product
        first, times = name.split()[0], clock(rng.randint(0, 90))
        said = [f"Hello, my {model} {item} ({order_id}) {problem}.",
                "I would like this sorted before the weekend if possible.",
                rng.choice(["I have been a customer for years and this is the first time this has happened.",
                            "Your chat said someone would call me back, but nobody did."])]
        msgs = [(next(times), f"{name} (customer)", fmt.wrap([" ".join(said[:1 + 2 * (budget >= 20)])], 90))]
        if budget >= 24:
            msgs.append((next(times), "system", [f"Ticket created via email. SLA: first reply within "
                                                 f"{rng.choice([4, 8, 24])} business hours."]))
        header = [f"Ticket {tid} · {model} {item}: {problem}", f"Status: {status} · Priority: "
                  f"{rng.choice(['normal', 'high'])} · Requester: {name} ({accounts[g]})"]
        room, turn, agent = budget - (3 if fact else 0), 0, rng.choice(AGENTS)
        while True:
            if turn % 2 == 0:
                agent = rng.choice(AGENTS)
                greeting = rng.choice([f"Hi {first}, thanks for getting in touch.", f"Hello again {first}.",
                                       f"Thanks {first}, that helps."])
                body = ([f"> {rng.choice(said)}", ""] if budget >= 20 else []) + [" ".join([greeting,
                    rng.choice(["Could you confirm the delivery address and a phone number for the courier?",
                                f"I have asked the warehouse to check the batch this {item} came from.",
                                "Could you send a photo of the label on the underside of the device?",
                                "I've opened a trace with the carrier; they usually answer within two working days.",
                                "Sorry about the wait. I've passed this to a colleague who handles these cases."])])]
                new = (next(times), agent, fmt.wrap(body, 90) if budget < 20 else body[:2] + fmt.wrap(body[2:], 90))
            elif turn % 4 == 3 and rng.random() < 0.5:
                new = (next(times), f"{agent.split()[0]} (internal note)", [rng.choice([
                    "Checked the carrier portal: last scan at the depot.", "Customer has one earlier ticket.",
                    f"Batch {code}-{rng.randint(100, 999)} had other reports of damage."])])
            else:
                new = (next(times), f"{name} (customer)", fmt.wrap([rng.choice([
                    "Thanks. The address is correct, and I'm reachable on the number in my account.",
                    "Here is the photo. The box was already dented when the driver handed it over.",
                    "I still have the original packaging if you need it back.",
                    "I have been waiting for four days now. Please give me an update.",
                    "My neighbour did not receive anything either, I asked.",
                    "Can you just send a new one? I don't mind returning this one."])], 90))
            if len(fmt.ticket_thread(header, msgs + [new])) > room and len(msgs) >= 2:
                break
            msgs.append(new)
            turn += 1
        while fact and len(fmt.ticket_thread(header, msgs)) < 12:     # the fact needs 15+ lines around it
            msgs.append((next(times), "system", [rng.choice(["Customer viewed the ticket.", "SLA reminder sent."])]))
        if fact:     # the customer's own follow-up, between the messages nearest the middle of the thread
            starts = [len(fmt.ticket_thread(header, msgs[:k])) + 2 for k in range(1, len(msgs) + 1)]
            k = starts.index(fmt.middle_index(rng, starts[-1] + 3, starts)) + 1
            msgs.insert(k, (None, f"{name} (customer)", [fact]))
            stamps = sorted(t for t, _, _ in msgs if t) + [next(times)]
            msgs = [(stamps[i], who, body) for i, (_, who, body) in enumerate(msgs)]
        stamped = [(t.strftime("%Y-%m-%d %H:%M"), who, body) for t, who, body in msgs]
        lines = fmt.ticket_thread(header, stamped)
        return "\n".join(lines)

    def ticket(g, place_, say):
        fact = None
        if place_:
            code = products[g][2]
            serial = f"{code}{rng.randint(10, 99)}-{rng.randint(100000, 999999)}"
            d.ask(place_, f"What serial number did the customer give in ticket {tickets[g]}?", serial)
            fact = f"Forgot to say: the serial number on the sticker underneath is {serial}."
        return Step(g, "get_ticket", {"ticket_id": tickets[g]},
                    thread(g, tickets[g], d.long() if fact else 3 * d.rows, products[g], problems[g], orders[g],
                           fact),
                    say=f"{people[g].split()[0]} reports that the {products[g][1]} {problems[g]}; the order is "
                    f"{orders[g]}. Checking the order first." if say else None)

    def history(g, place_, say):
        tid = old_tickets[g]
        text = thread(g, tid, 3 * d.rows - 2, rng.choice(PRODUCTS), rng.choice(PROBLEMS), old_orders[g],
                      status="closed")
        return Step(g, "get_ticket", {"ticket_id": tid}, text, say=rng.choice([
            "The earlier ticket was closed without a refund; same courier.",
            f"{tid} is an older, unrelated complaint; nothing to carry over."]) if say else None)

    def macro(g, place_, say):
        item, model, _ = products[g]
        slug = rng.choice(["damaged-on-arrival", "late-delivery", "duplicate-charge", "missing-parts", "wrong-item"])
        slug = slug if slug not in macros_read else f"{slug}-{len(macros_read)}"
        macros_read.append(slug)
        paras = ["Hi {{first_name}},", "Thank you for your patience, and I'm sorry about the trouble with your "
                 "{{product_name}}.", "I have checked your order {{order_id}} with our warehouse and the carrier.",
                 "Here is what happens next: we send a replacement by express delivery, and a prepaid return label "
                 "for the faulty one by email.", "You don't need to return anything before the replacement arrives.",
                 "If the carrier cannot deliver at a time that suits you, reply to this email with a better slot.",
                 "Your reference for this case is {{ticket_id}}; please keep it in any reply.",
                 "If anything is still not right, reply here and the same team will pick it up.",
                 "Kind regards,", "{{agent_name}}", "Customer care"]
        body = [line for p in paras for line in (p, "")][:max(3, 2 * d.rows - 2)]     # paragraphs, blank-separated
        text = "\n".join([f"# Macro: {slug.replace('-', ' ')}", f"Use for: {model} {item} and similar cases.", ""]
                          + body).rstrip()
        return Step(g, "read_policy", {"policy": f"macros/{slug}"}, text,
                    say="The macro fits; I'll adapt the second paragraph to this customer." if say else None)

    def events(k):
        steps = (["label_created", "picked_up"] + ["in_transit"] * max(0, k - 4) + ["at_depot", "out_for_delivery"])
        times = clock(rng.randint(0, 90))
        return [{"at": next(times).strftime("%Y-%m-%dT%H:%M:%SZ"), "status": st,
                 "location": rng.choice(["Venlo DC", "Duisburg hub", "Lyon depot", "Gdansk hub", "Malmö depot"]),
                 "detail": DETAILS[st]} for st in steps[-k:] if k]

    def order(g, place_, say, oid=None):
        oid = oid or orders[g]
        carrier, make = rng.choice(CARRIERS)
        tracking = make(rng)
        item, model, code = products[g] if oid == orders[g] else rng.choice(PRODUCTS)
        price = rng.randint(89, 1299) + rng.choice([0.0, 0.5, 0.9, 0.99])
        obj = {"order_id": oid, "status": rng.choice(["delivered", "in_transit", "out_for_delivery"]),
               "placed_at": iso(), "account_id": accounts[g],
               "items": [{"sku": f"{code}-{rng.randint(100, 999)}", "name": f"{model} {item}", "qty": 1,
                          "unit_price_eur": price}] + [
                   {"sku": f"ACC-{rng.randint(10, 99)}", "name": rng.choice(["descaler", "filter set", "spare brush"]),
                    "qty": rng.randint(1, 3), "unit_price_eur": rng.randint(5, 40) + 0.99} for _ in range(d.rows // 4)],
               "shipping": {"carrier": carrier, "tracking_number": tracking, "events": events(d.rows // 2 + 1)}}
        if place_ == "json":
            d.ask(place_, f"What is the tracking number of order {oid}?", tracking)
        if place_ == "recent":
            rma = f"RMA-{rng.randint(1000000, 9999999)}"
            obj["returns"] = [{"rma": rma, "status": "label_sent", "created_at": iso(), "reason": problems[g]}]
            d.ask(place_, f"What is the RMA number of the return on order {oid}?", rma)
        return Step(g, "lookup", {"kind": "order", "id": oid}, as_json(obj),
                    say=f"{oid} went out with {carrier}; the last scan is in the events list." if say else None)

    def order2(g, place_, say):
        return order(g, None, say, spare_orders.pop())

    def account(g, place_, say):
        while True:
            disputes, open_cents = [], 0
            for _ in range(2 + d.rows // 2):
                cents = rng.randint(1500, 90000)
                status = rng.choice(["open", "open", "won", "lost", "closed"])
                disputes.append({"id": f"DSP-{rng.randint(10000, 99999)}", "opened_at": iso(), "order_id":
                                 rng.choice(spare_orders), "amount_eur": cents / 100, "status": status,
                                 "reason": rng.choice(["item_not_received", "duplicate_charge", "damaged", "fraud"])})
                open_cents += cents * (status == "open")
            if sum(x["status"] == "open" for x in disputes) >= 2 and open_cents % 10:
                break
        total = f"{open_cents / 100:.2f}"
        opened = [x for x in disputes if x["status"] == "open"]
        oldest = min(opened, key=lambda x: x["opened_at"])["id"]
        obj = {"account_id": accounts[g], "name": people[g],
               "customer_since": f"{rng.randint(2015, 2023)}-{rng.randint(1, 12):02d}-01",
               "tier": rng.choice(["standard", "plus", "pro"]), "disputes": disputes,
               "recent_orders": [{"order_id": o, "placed_at": iso()[:10], "total_eur": rng.randint(20, 1400) + 0.9,
                                  "status": rng.choice(["delivered", "returned", "cancelled"])}
                                 for o in rng.sample(spare_orders, min(len(spare_orders), d.rows // 2))]}
        if place_:
            d.ask(place_, f"What total amount (EUR) of open disputes did you work out for account {accounts[g]}?",
                  total, "say")
        note = f"{accounts[g]} is a {obj['tier']} customer since {obj['customer_since'][:4]}." if say else None
        if place_:
            note = (f"{accounts[g]} has {len(opened)} open disputes totalling {total} EUR; the oldest is {oldest}. "
                    "I'll mention them before promising anything.")
        return Step(g, "lookup", {"kind": "account", "id": accounts[g]}, as_json(obj), say=note)

    def policy(g, place_, say):
        name = "refunds" if place_ else rng.choice([p for p in ["delivery", "warranty", "returns", "goodwill",
                                                                "damaged-goods", "chargebacks"]
                                                    if p not in policies_read] or ["escalation"])
        policies_read.append(name)
        text = _policy(rng, d.long() if place_ else d.medium(), name, shop, queues)
        if place_:
            queue = approval_queue
            d.ask(place_, "Which queue must you assign refunds that need team-lead approval to, per the refunds "
                  "policy?", queue)
            lines = text.split("\n")
            lines = fmt.put_middle(rng, lines, [i for i, line in enumerate(lines) if line.startswith("- ")],
                                   f"- Refunds above {rng.choice([150, 200, 250, 300])} EUR need team-lead approval: "
                                   f"assign the ticket to the `{queue}` queue and do not promise a date.")
            text = "\n".join(lines)
        return Step(g, "read_policy", {"policy": name}, text,
                    say=f"The {name} policy applies here; nothing in it blocks a resolution." if say else None)

    def opener(g):
        return rng.choice([f"Next ticket: {tickets[g]} from {people[g]}. Please handle it.",
                           f"Can you pick up {tickets[g]}? The customer has written twice already.",
                           f"{tickets[g]} is next in the queue; {people[g].split()[0]} is waiting on a reply."])

    def user_fact(g):
        d.ask("user", f"After what time does the customer of ticket {tickets[g]} want deliveries?", deliver_after,
              "user")
        return (f"Update on {tickets[g]}: {people[g].split()[0]} phoned in. Deliveries only after {deliver_after}, "
                "as they work mornings. Please make sure the courier gets that.")

    plans = plan(size, [("ticket", "middle"), ("account", "assistant"), ("order", "json"), ("policy", "middle"),
                         ("user", "user")], "order", head=["ticket"],
                  fillers=["order", "account", "history", "policy", "macro", "order2", "order2"], tail=[],
                  order=["order", "account", "history", "policy", "macro", "order2"])
    write_steps(d, plans, dict(ticket=ticket, history=history, macro=macro, order=order, order2=order2,
                          account=account, policy=policy), opener, user_fact)
    task = (f"You're on the {shop} customer-support queue today. Work through the tickets "
            f"{', '.join(tickets)} one at a time: read the thread, check the order and account, follow the "
            "written policies, and tell me what you would do for each customer.")
    return Episode("support", seed, shared()[1], task,
                   [tool("get_ticket", "Read a support ticket thread.", ticket_id="string"),
                    tool("lookup", "Look up a record as JSON; kind is order or account.", kind="string", id="string"),
                    tool("read_policy", "Read an internal policy document (markdown).", policy="string")],
                   d.steps, d.questions, d.facts)


_POLICY_RULES = [
    "Items returned within {n} days in their original packaging get a full refund.",
    "Opened small appliances can be returned within {n} days if they are unused and complete.",
    "Refund to the original payment method only; never to a different card or a bank transfer.",
    "Delivery complaints must be raised within {n} days of the carrier's delivered scan.",
    "For damaged goods, ask for photos of the item and of the outer box before anything else.",
    "Goodwill credit is capped at {n} EUR per customer per rolling year.",
    "Replacements ship express at no cost when the first item arrived damaged.",
    "Chargebacks go to the `{queue}` queue; do not refund an order with an open chargeback.",
    "Suspected fraud goes to the `{queue}` queue with the order id in the subject line.",
    "Warranty claims after {n} months need the serial number and the proof of purchase.",
    "If the carrier shows delivered but the customer disagrees, open a trace with the carrier first.",
    "Do not quote internal queue names or policy versions to customers.",
    "Customers with {n} or more returns in a year are reviewed by the `{queue}` team.",
    "Partial refunds need the customer's written agreement in the ticket.",
    "Escalate to a team lead when a customer mentions legal action or the press.",
    "Address changes after dispatch are handled by the `{queue}` queue with the carrier.",
]


def _policy(rng, budget: int, name: str, shop: str, queues: List[str]) -> str:
    """An internal policy document: sections of bullet rules up to ``budget`` lines.  Queue names come from
    ``queues``, which no longer holds the asked one: these are all distractors."""
    rules = rng.sample(_POLICY_RULES, len(_POLICY_RULES))
    sections, used = [], 2
    for heading in ["Scope", "Eligibility", "Approvals", "Special cases", "Escalation", "Record keeping"]:
        k = min(len(rules), max(2, (budget - 2) // 6))
        if used + 3 + k > budget or not rules:
            break
        body = [f"- {rules.pop().format(n=rng.choice([3, 14, 30, 45, 60]), queue=rng.choice(queues))}"
                for _ in range(k)]
        sections.append((heading, body))
        used += 3 + k
    title = f"{name.replace('-', ' ').title()} policy ({shop}, v{rng.randint(3, 9)}.{rng.randint(0, 9)})"
    return "\n".join(fmt.markdown(sections, title))
