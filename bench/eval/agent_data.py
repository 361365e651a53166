"""The data family: a data agent analysing a warehouse: psql tables, pandas outputs, a data dictionary, job-status JSON."""
from __future__ import annotations

import json
import random
from datetime import datetime, timedelta

from . import agent_outputs as fmt
from .agent_draft import Draft, plan, shared, write_steps
from .episode import Episode, Size, Step, tool


WAREHOUSES = ["analytics", "dwh_prod", "warehouse"]
PLANS = ["starter", "team", "business", "enterprise"]
REGIONS = ["emea", "na", "apac", "latam"]
COUNTRIES = ["DE", "FR", "GB", "NL", "SE", "ES", "IT", "PL", "US", "CA", "BR", "MX", "JP", "AU", "IN", "SG",
             "DK", "NO", "FI", "IE", "PT", "AT", "CH", "BE"]
# table: columns with their types (the first is the key)
TABLES = {
    "accounts": [("account_id", "bigint"), ("plan", "text"), ("region", "text"), ("country", "text"),
                 ("created_at", "timestamp with time zone"), ("mrr_eur", "numeric(10,2)"), ("seats", "integer"),
                 ("churned_at", "timestamp with time zone"), ("sales_owner", "text")],
    "subscriptions": [("subscription_id", "bigint"), ("account_id", "bigint"), ("plan", "text"),
                      ("started_at", "date"), ("ended_at", "date"), ("mrr_eur", "numeric(10,2)"),
                      ("billing_period", "text"), ("discount_pct", "numeric(5,2)")],
    "invoices": [("invoice_id", "bigint"), ("account_id", "bigint"), ("issued_at", "date"),
                 ("amount_eur", "numeric(12,2)"), ("status", "text"), ("paid_at", "date"), ("currency", "text")],
    "trials": [("trial_id", "bigint"), ("account_id", "bigint"), ("started_at", "date"),
               ("converted_at", "date"), ("days_to_convert", "numeric(6,2)"), ("source", "text")],
    "refunds": [("refund_id", "bigint"), ("invoice_id", "bigint"), ("amount_eur", "numeric(12,2)"),
                ("reason", "text"), ("created_at", "date"), ("approved_by", "text")],
    "events": [("event_id", "bigint"), ("account_id", "bigint"), ("name", "text"), ("ts", "timestamp"),
               ("properties", "jsonb")],
    "signups": [("signup_id", "bigint"), ("email_domain", "text"), ("created_at", "date"), ("utm_source", "text"),
                ("plan", "text")],
}
CATEGORIES = {"plan": PLANS, "region": REGIONS, "country": COUNTRIES,
              "status": ["paid", "open", "void", "uncollectible"], "currency": ["EUR", "USD", "GBP", "SEK"],
              "reason": ["duplicate", "requested_by_customer", "fraudulent", "service_outage", "downgrade"],
              "billing_period": ["monthly", "annual"], "source": ["organic", "paid_search", "partner", "referral"],
              "utm_source": ["google", "newsletter", "linkedin", "partner", "direct", "podcast", "g2"],
              "name": ["login", "invite_sent", "report_exported", "plan_changed", "seat_added", "api_key_created"],
              "sales_owner": ["a.khan", "j.berg", "m.rossi", "s.ito", "unassigned"],
              "approved_by": ["a.khan", "j.berg", "auto"], "email_domain": ["gmail.com", "outlook.com", "acme.io",
                                                                         "globex.com", "initech.de", "umbrella.co"]}
PIPELINES = ["orders_daily", "accounts_snapshot", "invoices_sync", "events_compaction", "trials_rollup"]


def _note(rng, i: int, column: str, ty: str) -> str:
    if i == 0:
        return "Primary key."
    if column.endswith("_id"):
        return f"Foreign key to {column[:-3]}s."
    if column in CATEGORIES:
        return "One of: " + ", ".join(CATEGORIES[column][:4]) + (", ..." if len(CATEGORIES[column]) > 4 else ".")
    if ty.startswith(("timestamp", "date")):
        return rng.choice(["UTC.", "Null while active.", "Set by the billing sync.", "Backfilled in 2022."])
    return rng.choice(["Includes discounts.", "Excludes VAT.", "Converted at the month-end rate.", "Never negative."])


def build_data(rng: random.Random, seed: int, size: Size) -> Episode:
    d = Draft(rng, size)
    n = size.sub_goals
    wh = rng.choice(WAREHOUSES)
    shuffled = rng.sample(list(TABLES), len(TABLES))
    tables = [shuffled[g % len(shuffled)] for g in range(n)]
    cutoff = str(rng.randint(700000, 899999))
    jobs = [f"{p}-{rng.randint(1000, 9999)}" for p in rng.sample(PIPELINES, len(PIPELINES))]
    calls: set = set()

    def unique(code):
        """The call's arguments, made unique (the environment answers a call by its arguments)."""
        k = 2
        base = code
        while code in calls:
            code, k = f"{base}  # {k}", k + 1
        calls.add(code)
        return code

    def cell(col, ty):
        """A plausible value for a column, by its name and type (as pandas prints it)."""
        if col in CATEGORIES:
            return rng.choice(CATEGORIES[col])
        if ty == "bigint":
            return rng.randint(100000, 999999)
        if ty == "integer":
            return rng.randint(1, 400)
        if ty.startswith("numeric"):
            return round(rng.uniform(0, 40) if "pct" in col else rng.uniform(1, 4800), 2)
        day = datetime(2023, 1, 1) + timedelta(days=rng.randint(0, 540), seconds=rng.randint(0, 86399))
        if ty == "date":
            return day.strftime("%Y-%m-%d")
        if ty.startswith("timestamp"):
            return day.strftime("%Y-%m-%d %H:%M:%S") + ("+00:00" if "zone" in ty else "")
        return '{"v": 2}'

    def kinds(t, want):
        return [c for c, ty in TABLES[t] if want(ty)]

    def query(g, place_, say):
        t = tables[g]
        if d.rows >= len(TABLES[t]) and rng.random() < 0.5:     # \d has a fixed size: only in larger episodes
            cols = TABLES[t]
            w, tw = max(len(c) for c, _ in cols), max(len(ty) for _, ty in cols)
            lines = [f"Table \"public.{t}\"".center(w + tw + 30).rstrip(),
                     f" {'Column'.ljust(w)} | {'Type'.ljust(tw)} | Collation | Nullable | Default",
                     f"-{'-' * w}-+-{'-' * tw}-+-----------+----------+---------"]
            lines += [f" {c.ljust(w)} | {ty.ljust(tw)} |           | {'not null' if i == 0 else '':8} |"
                      for i, (c, ty) in enumerate(cols)]
            lines += ["Indexes:", f"    \"{t}_pkey\" PRIMARY KEY, btree ({cols[0][0]})"]
            return Step(g, "run_sql", {"query": unique(f"\\d {t}")}, "\n".join(lines),
                        say=f"{t} has {len(cols)} columns; {cols[0][0]} is the key." if say else None)
        when = kinds(t, lambda ty: ty in ("date", "timestamp") or ty.startswith("timestamp"))[0]
        amount = (kinds(t, lambda ty: ty.startswith("numeric")) or [None])[0]
        months = [(datetime(2024, 1, 1) + timedelta(days=31 * i)).strftime("%Y-%m-01")
                  for i in range(d.rows + d.rows // 2)]
        rows = [[mo, rng.randint(200, 9000)] + ([round(rng.uniform(1e4, 9e5), 2)] if amount else [])
                for mo in months]
        sql = (f"SELECT date_trunc('month', {when})::date AS month, count(*) AS n"
               + (f", sum({amount}) AS {amount}" if amount else "") + f" FROM {t} GROUP BY 1 ORDER BY 1;")
        return Step(g, "run_sql", {"query": unique(sql)},
                    fmt.psql_table(["month", "n"] + ([amount] if amount else []), rows),
                    say=f"Monthly volume in {t} is steady apart from the spike in {rng.choice(rows)[0][:7]}." if say
                    else None)

    def top(g, place_, say):
        t = tables[g]
        key = "account_id" if any(c == "account_id" for c, _ in TABLES[t]) else TABLES[t][0][0]
        amount = (kinds(t, lambda ty: ty.startswith("numeric")) or [None])[0]
        k = max(2, 2 * d.rows - 2)
        sql = (f"SELECT {key}, count(*) AS n" + (f", round(sum({amount}), 2) AS {amount}" if amount else "")
               + f" FROM {t} GROUP BY 1 ORDER BY 2 DESC LIMIT {k};")
        counts = sorted((rng.randint(40, 3000) for _ in range(k)), reverse=True)
        rows = [[rng.randint(100000, 999999), c] + ([round(c * rng.uniform(20, 400), 2)] if amount else [])
                for c in counts]
        return Step(g, "run_sql", {"query": unique(sql)},
                    fmt.psql_table([key, "n"] + ([amount] if amount else []), rows),
                    say=f"The top {key} values look like real customers, not test data." if say else None)

    def head(g, place_, say):
        t = tables[g]
        cols = [(c, ty) for c, ty in TABLES[t] if ty != "jsonb"][:6]
        k = max(3, 2 * d.rows - 2)
        code = f"df_{t} = pd.read_sql_table('{t}', engine)\ndf_{t}.head({k})"
        return Step(g, "run_python", {"code": unique(code)},
                    fmt.frame([c for c, _ in cols], [[cell(c, ty) for c, ty in cols] for _ in range(k)]),
                    say=f"The frame loads fine; {cols[0][0]} comes back as int64." if say else None)

    def counts(g, place_, say):
        t = tables[g]
        when = kinds(t, lambda ty: ty == "date" or ty.startswith("timestamp"))[0]
        k = max(2, 2 * d.rows - 2)
        months = [(datetime(2023, 7, 1) + timedelta(days=31 * i)).strftime("%Y-%m") for i in range(k)]
        code = f"df_{t}['{when}'].dt.to_period('M').value_counts().sort_index().tail({k})"
        return Step(g, "run_python", {"code": unique(code)},
                    fmt.value_counts(when, [(m, rng.randint(400, 9000)) for m in months]),
                    say=f"No empty months in {t}; volume roughly doubles over the period." if say else None)

    def describe(g, place_, say):
        t = tables[g]
        cols = kinds(t, lambda ty: ty.startswith("numeric") or ty == "integer")
        code = f"df_{t}[{cols!r}].describe()"
        if not cols:
            key = "account_id" if any(c == "account_id" for c, _ in TABLES[t]) else TABLES[t][1][0]
            cols, code = ["n"], f"df_{t}.groupby('{key}').size().to_frame('n').describe()"
        samples = [[float(cell(c, ty)) for _ in range(50)] for c, ty in TABLES[t] if c in cols] or [
            [float(rng.randint(1, 90)) for _ in range(50)]]
        extra = [0.01, 0.05, 0.1, 0.9, 0.95, 0.99][:max(0, d.rows - 6)]
        if extra:
            code = code.replace(".describe()", f".describe(percentiles={sorted(extra + [0.25, 0.5, 0.75])})")
        return Step(g, "run_python", {"code": unique(code)}, fmt.describe(cols, samples, extra),
                    say="Skewed; I'll use medians rather than means for this table." if say else None)

    def job(g, place_, say):
        jid = jobs.pop() if jobs else f"adhoc-{rng.randint(1000, 9999)}"
        written = rng.randint(1200000, 9800000)
        stages = []
        for name in ["extract", "validate", "dedupe", "enrich", "transform", "join_accounts", "aggregate",
                     "quality_checks", "load", "publish", "vacuum", "notify"][:max(2, d.rows - 2)]:
            stages.append({"name": name, "state": "SUCCEEDED", "rows_in": written + rng.randint(1000, 90000),
                           "rows_out": written + rng.randint(1000, 90000), "seconds": rng.randint(4, 900)})
        obj = {"job_id": jid, "pipeline": jid.rsplit("-", 1)[0], "state": "SUCCEEDED",
               "started_at": f"2024-06-{rng.randint(1, 28):02d}T02:{rng.randint(0, 59):02d}:00Z",
               "duration_s": sum(x["seconds"] for x in stages), "rows_read": written + rng.randint(20000, 200000),
               "rows_written": written, "rows_rejected": rng.randint(0, 4000), "stages": stages,
               "output_path": f"s3://{wh}-lake/{jid.rsplit('-', 1)[0]}/dt=2024-06-{rng.randint(1, 28):02d}/"
                              f"part-{rng.randint(0, 999):05d}.parquet"}
        if place_ == "json":
            d.ask(place_, f"How many rows did job {jid} write?", str(written))
        if place_ == "recent":
            d.ask(place_, f"What output_path did job {jid} report?", obj["output_path"])
        text = json.dumps(obj, indent=2)
        if rng.random() < 0.5 or text.count("\n") >= 4 * d.rows + 10:
            text = fmt.layered_json(obj, 1)
        return Step(g, "get_job_status", {"job_id": jid}, text,
                    say=f"{jid} succeeded with {obj['rows_rejected']} rejected rows; the data is fresh." if say
                    else None)

    def dictionary(g, place_, say):
        threshold = str(rng.randint(100100, 199900))
        d.ask(place_, "Below which account_id are accounts internal test accounts, per the data dictionary?",
              threshold)
        sections = []
        for t in rng.sample([t for t in TABLES if t != "accounts"], len(TABLES) - 1):
            sections.append([f"## {t}", ""] + [f"- `{c}` ({ty}): {_note(rng, i, c, ty)}" for i, (c, ty) in
                                                  enumerate(TABLES[t][:max(2, d.rows // 2)])] + [""])
        head = [f"# Data dictionary (warehouse `{wh}`, schema `public`)", ""]
        accounts = ["## accounts", "", f"- `account_id` (bigint): primary key. Ids below {threshold} are internal "
                    "test accounts; exclude them from every metric."] + [
            f"- `{c}` ({ty}): {_note(rng, 1, c, ty)}" for c, ty in TABLES["accounts"][1:max(2, d.rows // 2)]] + [""]
        while len(head) + sum(map(len, sections)) + len(accounts) > d.long() + 1 and len(sections) > 2:
            sections.pop()
        starts, pos = [], len(head)
        for sec in sections + [[]]:
            starts.append(pos)
            pos += len(sec)
        at = fmt.middle_index(rng, pos + len(accounts), [x + 2 for x in starts]) - 2
        sections.insert(starts.index(at), accounts)
        lines = head + [line for sec in sections for line in sec]
        return Step(g, "run_python", {"code": unique("print(open('docs/data_dictionary.md').read())")},
                    "\n".join(lines[:-1]), say="The dictionary explains the status columns; noted." if say else None)

    def series(g, place_, say):
        plan = rng.choice(PLANS)
        k = 2 * d.rows + 2
        while True:
            cents = sorted(rng.randint(50, 9000) for _ in range(k))
            mid = cents[k // 2 - 1] + cents[k // 2]
            if mid % 2:
                break
        median = f"{mid // 200}.{(mid % 200) * 5:03d}"
        d.ask("assistant", f"What median days_to_convert did you compute for {plan}-plan trials?", median, "say")
        code = (f"s = df_trials.loc[df_trials.plan == '{plan}', 'days_to_convert'].sort_values()"
                ".reset_index(drop=True)\nprint(s)")
        return Step(g, "run_python", {"code": unique(code)}, fmt.series([c / 100 for c in cents], "days_to_convert",
                                                                      "float64"),
                    say=f"For {plan}-plan trials the median days_to_convert is {median} (n={k}); the mean is pulled "
                    "up by a few slow enterprise deals, so I'll report the median.")

    def weekly(g, place_, say):
        k = max(12, 3 * d.rows + 3)
        start = datetime(2024, 1, 1) + timedelta(weeks=rng.randint(0, 20))
        weeks = [(start + timedelta(weeks=i)).strftime("%Y-%m-%d") for i in range(k)]
        rows = [[w, rng.randint(10000, 99999), rng.randint(1000, 9999), rng.randint(100, 999)] for w in weeks]
        at = fmt.middle_index(rng, k + 3, list(range(2, k + 2))) - 2
        d.ask(place_, f"In the weekly signups query, how many signups were counted for the week of {weeks[at]}?",
              str(rows[at][1]))
        sql = ("SELECT date_trunc('week', created_at)::date AS week, count(*) AS signups, "
               "count(*) FILTER (WHERE plan <> 'starter') AS paid, count(DISTINCT utm_source) AS sources "
               "FROM signups GROUP BY 1 ORDER BY 1;")
        return Step(g, "run_sql", {"query": unique(sql)},
                    fmt.psql_table(["week", "signups", "paid", "sources"], rows),
                    say="Weekly signups look seasonal; no gaps in the series." if say else None)

    def opener(g):
        t = tables[g]
        return rng.choice([f"Next stage: look at the {t} table and tell me whether it's usable for the review.",
                           f"Now the {t} data, please. Same checks as before.",
                           f"Moving on to {t}. Anything odd in there should go in the caveats section."])

    def user_fact(g):
        d.ask("user", "What cutoff id did I give you for the analysis?", cutoff, "user")
        return (f"Before you go further: use the fiscal year starting April 1, and only count accounts with an id "
                f"above the cutoff {cutoff} (older ones were migrated and are unreliable).")

    plans = plan(size, [("dict", "middle"), ("series", "assistant"), ("job", "json"), ("weekly", "middle"),
                         ("user", "user")], "job", head=["query"],
                  fillers=["head", "counts", "top", "job", "describe", "query", "job"], tail=[],
                  order=["dict", "job", "head", "top", "series", "counts", "weekly", "describe", "query"])
    write_steps(d, plans, dict(query=query, head=head, counts=counts, describe=describe, job=job, dict=dictionary,
                          top=top, series=series, weekly=weekly), opener, user_fact)
    task = (f"We need the quarterly churn and conversion review from the `{wh}` warehouse. Work through the tables "
            f"{', '.join(dict.fromkeys(tables))} one at a time: check the nightly loads, profile the data, and "
            "compute the numbers I ask for. run_sql talks to Postgres; run_python has pandas and an `engine`.")
    return Episode("data", seed, shared()[1], task,
                   [tool("run_sql", "Run a SQL query on the warehouse (psql output).", query="string"),
                    tool("run_python", "Run Python (pandas) in the analysis kernel; returns stdout.", code="string"),
                    tool("get_job_status", "Status of a pipeline job, as JSON.", job_id="string")],
                   d.steps, d.questions, d.facts)
