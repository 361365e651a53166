"""Held-out agent histories for bench/heldout.py: the episode records and the three task kinds' generators
(sre, analyst, review), seeded; see bench/heldout.py for what they measure."""
from __future__ import annotations

import json
import statistics
import random
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

CATEGORIES = ("stated", "middle", "instruction")
KINDS = ("sre", "analyst", "review")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ====================================================================== episodes
@dataclass
class Question:
    category: str
    prompt: str
    answer: str
    where: str = ""          # the path/query the value came from (diagnostics)


@dataclass
class Episode:
    kind: str
    seed: int
    system: str
    tools: list
    task: str
    steps: List[List[dict]] = field(default_factory=list)   # each step: one Session.add call
    questions: List[Question] = field(default_factory=list)
    fact_steps: List[int] = field(default_factory=list)     # indices of the steps that read the asked facts
    history_tokens: int = 0
    max_step_tokens: int = 0


def tool_spec(name: str, desc: str, **params) -> dict:
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
        "required": list(params)}}}


class Builder:
    """Accumulates the steps of one episode; ``count`` gives a text's token count."""

    def __init__(self, rng: random.Random, count: Callable[[str], int]):
        self.rng, self.count = rng, count
        self.steps: List[List[dict]] = []
        self.tokens = 0

    def _id(self) -> str:
        return f"call_{self.rng.getrandbits(40):010x}"

    def call(self, name: str, args: dict, output: str, say: Optional[str] = None) -> int:
        cid = self._id()
        step = [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
                {"role": "tool", "tool_call_id": cid, "content": output}]
        if say:
            step.append({"role": "assistant", "content": say})
        self.steps.append(step)
        n = self.count(json.dumps(args)) + self.count(output) + (self.count(say) if say else 0) + 24
        self.tokens += n
        self.max_step = max(getattr(self, "max_step", 0), n)
        return len(self.steps) - 1


def mid_line(lines: List[str], pred, rng: random.Random) -> Optional[int]:
    """An index in the middle 30% (else 50%, 70%) of ``lines`` whose line satisfies ``pred``."""
    n = len(lines)
    for lo, hi in ((0.35, 0.65), (0.25, 0.75), (0.15, 0.85)):
        cands = [i for i in range(int(n * lo), int(n * hi) + 1) if i < n and pred(lines[i])]
        if cands:
            return rng.choice(cands)
    return None


# ---------------------------------------------------------------------- sre
SRE_SERVICES = ["auth", "billing", "search", "ingest", "notify", "gateway", "media", "profile", "catalog",
                "scheduler", "export", "webhooks", "quota", "geo", "inventory", "pricing", "reports", "mailer"]
SRE_KEYS = {  # section -> key -> value generator (numeric keys are the facts; all services share them)
    "server": {"port": lambda r: r.randint(8000, 9899), "workers": lambda r: r.randint(11, 96),
               "keepalive_s": lambda r: r.randint(15, 240), "max_body_kb": lambda r: r.randint(128, 9000)},
    "database": {"max_pool_size": lambda r: r.randint(12, 180), "min_pool_size": lambda r: r.randint(2, 9),
                 "idle_timeout_s": lambda r: r.randint(45, 1800), "statement_timeout_ms": lambda r: r.randint(700, 45000),
                 "host": lambda r: f"pg-{r.choice(['east', 'west', 'core'])}-{r.randint(1, 9)}.internal"},
    "cache": {"ttl_seconds": lambda r: r.randint(30, 7200), "max_entries": lambda r: r.randint(1000, 250000),
              "shard_count": lambda r: r.randint(3, 64), "eviction": lambda r: r.choice(["lru", "lfu", "fifo"])},
    "limits": {"rate_per_min": lambda r: r.randint(120, 24000), "burst": lambda r: r.randint(10, 900),
               "drain_timeout_s": lambda r: r.randint(10, 600), "retry_budget_pct": lambda r: r.randint(5, 40)},
    "logging": {"level": lambda r: r.choice(["info", "warn", "debug"]), "retention_days": lambda r: r.randint(7, 400),
                "sample_rate": lambda r: round(r.uniform(0.01, 0.99), 2)},
    "features": {"canary_enabled": lambda r: r.choice([True, False]), "strict_tls": lambda r: r.choice([True, False]),
                 "shadow_reads": lambda r: r.choice([True, False])},
}
SRE_COMMENTS = ["owner: team-{t}", "reviewed {d}", "managed by configsync, edit upstream", "see runbook RB-{n}",
                "do not lower without a capacity review", "values tuned after incident INC-{n}"]


def _fmt_val(v, fmt):
    if isinstance(v, bool):
        return ("true" if v else "false") if fmt != "ini" else ("yes" if v else "no")
    if isinstance(v, str) and fmt in ("toml",):
        return f'"{v}"'
    return str(v)


def sre_config(rng: random.Random, svc: str, fmt: str):
    """``(text, {key: value_str}, lines)``: 25-40 lines."""
    sections = list(SRE_KEYS)
    rng.shuffle(sections)
    vals: Dict[str, str] = {}
    data = {}
    for s in sections:
        data[s] = {k: g(rng) for k, g in SRE_KEYS[s].items()}
    comment = lambda: rng.choice(SRE_COMMENTS).format(t=rng.choice("abcdefgh") + str(rng.randint(1, 9)),
                                                      d=f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                                                      n=rng.randint(100, 9999))
    lines: List[str] = []
    if fmt == "json":
        text = json.dumps({"service": svc, **data}, indent=2)
        lines = text.splitlines()
    else:
        c = "#" if fmt in ("toml", "yaml") else ";"
        lines.append(f"{c} {svc} service configuration")
        lines.append(f"{c} {comment()}")
        for s in sections:
            lines.append("")
            if rng.random() < 0.4:
                lines.append(f"{c} {comment()}")
            lines.append(f"{s}:" if fmt == "yaml" else f"[{s}]")
            for k, v in data[s].items():
                fv = _fmt_val(v, fmt)
                lines.append(f"  {k}: {fv}" if fmt == "yaml" else (f"{k} = {fv}" if fmt == "toml" else f"{k}={fv}"))
        text = "\n".join(lines)
    for s in data:
        for k, v in data[s].items():
            vals[k] = _fmt_val(v, "json")
    return text, vals, lines


def sre_log(rng: random.Random, svc: str, n: int) -> str:
    t = rng.randint(0, 80000)
    out = []
    for _ in range(n):
        t += rng.randint(1, 40)
        ts = f"2025-03-{11 + t // 86400:02d}T{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}.{rng.randint(0, 999):03d}Z"
        other = rng.choice(SRE_SERVICES)
        msg = rng.choice([
            f"INFO  [http] {rng.choice(['GET', 'POST', 'PUT'])} /v2/{rng.choice(['items', 'users', 'jobs', 'tokens'])} "
            f"status={rng.choice([200, 200, 200, 201, 204, 404])} dur={rng.randint(2, 900)}ms",
            f"WARN  [client] upstream {other} slow: {rng.randint(900, 6000)}ms",
            f"ERROR [db] pool exhausted, waited {rng.randint(200, 5000)}ms for a connection",
            f"INFO  [gc] pause {rng.randint(3, 180)}ms heap={rng.randint(200, 1900)}MiB",
            f"WARN  [retry] call to {other} attempt={rng.randint(2, 5)} backoff={rng.randint(50, 3000)}ms",
            f"INFO  [sched] job {rng.getrandbits(24):06x} finished in {rng.randint(1, 600)}s"])
        out.append(f"{ts} {svc} {msg}")
    return "\n".join(out)


def sre_pods(rng: random.Random, svc: str) -> str:
    rows = ["NAME                                READY   STATUS    RESTARTS   AGE"]
    for _ in range(rng.randint(4, 9)):
        rows.append(f"{svc}-{rng.getrandbits(32):08x}-{rng.getrandbits(20):05x}".ljust(36) +
                    f"{rng.choice(['1/1', '1/1', '0/1'])}     {rng.choice(['Running', 'Running', 'Running', 'CrashLoopBackOff'])}"
                    f"   {rng.randint(0, 14):<10} {rng.randint(1, 60)}d")
    return "\n".join(rows)


def sre_df(rng: random.Random) -> str:
    rows = ["Filesystem      Size  Used Avail Use% Mounted on"]
    for m in ["/", "/var/lib/postgresql", "/var/log", "/data", "/tmp"]:
        size = rng.randint(20, 900)
        used = rng.randint(1, size)
        rows.append(f"/dev/nvme{rng.randint(0, 3)}n1p{rng.randint(1, 4)}  {size}G {used}G {size - used}G "
                    f"{100 * used // size}% {m}")
    return "\n".join(rows)


def make_sre(rng, count, target) -> Episode:
    svcs = rng.sample(SRE_SERVICES, 14)
    fmts = {"toml": "config.toml", "yaml": "config.yaml", "json": "config.json", "ini": "settings.ini"}
    secret = f"services/{rng.choice([s for s in SRE_SERVICES if s not in svcs[:4]])}/{rng.choice(['secrets.env', 'vault-token', 'prod.key'])}"
    ticket = f"OPS-{rng.randint(1000, 9999)}"
    handle = f"@{rng.choice(['mira', 'tobias', 'lena', 'kofi', 'ana', 'ravi'])}-{rng.choice(['oncall', 'sre', 'infra'])}{rng.randint(2, 99)}"
    window = f"{rng.choice(['Tuesday', 'Wednesday', 'Thursday', 'Saturday'])} {rng.randint(0, 5):02d}:{rng.choice([15, 30, 45])} UTC"
    rules = [
        ("ticket", f"File every finding under ticket {ticket}.",
         "Which ticket did I ask you to file every finding under? Answer with the ticket id only.", ticket),
        ("secret", f"Never open or modify {secret}; it is out of scope.",
         "Which file did I tell you never to open or modify? Answer with the path only.", secret),
        ("handle", f"Escalate anything severe to {handle}.",
         "Who should anything severe be escalated to? Answer with the handle only.", handle),
        ("window", f"Restarts are only allowed in the maintenance window, {window}.",
         "When is the maintenance window for restarts? Answer with the day and time only.", window.split()[1]),
    ]
    task = ("Audit the production service configs and logs for capacity risks before the quarterly review. "
            "Rules for this audit: " + " ".join(r[1] for r in rules) +
            " Report a short list of risks at the end.")
    b = Builder(rng, count)
    b.tokens = count(task) + 200
    ep = Episode("sre", 0, "You are an SRE agent with shell access. Use the tools to inspect the system and follow "
                 "the user's rules.",
                 [tool_spec("read_file", "Read a file from the ops repository.", path="path of the file"),
                  tool_spec("run_shell", "Run a read-only shell command on the bastion host.", command="the command")],
                 task)
    configs = {}

    def read_config(svc, fmt=None):
        fmt = fmt or rng.choice(list(fmts))
        path = f"services/{svc}/{fmts[fmt]}"
        text, vals, lines = sre_config(rng, svc, fmt)
        configs[path] = (vals, lines, fmt)
        return path, text, vals, lines

    numeric = [k for s in SRE_KEYS.values() for k, g in s.items() if k not in ("port",)
               and isinstance(g(random.Random(0)), int) and not isinstance(g(random.Random(0)), bool)]
    said = ["{path} sets {key} = {val}.", "Noted: {key} is {val} in {path}.",
            "{path}: {key} = {val}; I'll compare it with the other services."]
    used_keys = set()
    plan = ["stated", "filler", "middle", "stated", "middle"]
    fmt_cycle = rng.sample(list(fmts), 4) + [rng.choice(list(fmts))]
    for i, what in enumerate(plan):
        if what == "filler":
            svc = rng.choice(svcs[6:])
            b.call("run_shell", {"command": f"tail -n 12 /var/log/{svc}/app.log"}, sre_log(rng, svc, 12))
            continue
        svc = svcs[i]
        path, text, vals, lines = read_config(svc, fmt_cycle[i])
        eligible = [k for k in numeric if k in vals and k not in used_keys and len(vals[k]) >= 3]
        if what == "stated":
            key = rng.choice(eligible)
            used_keys.add(key)
            ep.fact_steps.append(b.call("read_file", {"path": path}, text,
                                        say=rng.choice(said).format(path=path, key=key, val=vals[key])))
        else:
            idx = mid_line(lines, lambda ln: any(re.search(rf'\b"?{k}"?\s*[:=]', ln) for k in eligible), rng)
            key = next(k for k in eligible if re.search(rf'\b"?{k}"?\s*[:=]', lines[idx]))
            used_keys.add(key)
            ep.fact_steps.append(b.call("read_file", {"path": path}, text))
        ep.questions.append(Question(what, f"What is {key} in {path}? Answer with the value only.", vals[key], path))
    # the rest of the audit: other services' configs (same keys, other values), logs, pods, disks
    k = 5
    while b.tokens < target:
        r = rng.random()
        svc = svcs[k] if k < len(svcs) else rng.choice(svcs[5:])  # never a fact's file again
        if r < 0.4:
            path, text, vals, _ = read_config(svc)
            if path in configs and rng.random() < 0.3:
                pass
            key = rng.choice(sorted(vals))
            say = rng.choice([None, None, f"Nothing unusual in {path}.",
                              f"{svc} looks sane; {key} is within the usual range."])
            b.call("read_file", {"path": path}, text, say=say)
            k += 1
        elif r < 0.7:
            n = rng.randint(8, 16)
            b.call("run_shell", {"command": f"tail -n {n} /var/log/{svc}/app.log"}, sre_log(rng, svc, n),
                   say=rng.choice([None, f"The {svc} log shows a few slow upstream calls; moving on."]))
        elif r < 0.85:
            b.call("run_shell", {"command": f"kubectl get pods -n {svc}"}, sre_pods(rng, svc))
        else:
            host = f"{svc}-db-{rng.randint(1, 3)}"
            b.call("run_shell", {"command": f"ssh {host} df -h"}, sre_df(rng))
    for name, _, q, a in rng.sample(rules, 2):
        ep.questions.append(Question("instruction", q, a, name))
    ep.steps, ep.history_tokens, ep.max_step_tokens = b.steps, b.tokens, b.max_step
    return ep


# ---------------------------------------------------------------------- analyst
REGIONS = ["EMEA", "NA-East", "NA-West", "LATAM", "APAC", "ANZ"]
SEGMENTS = ["smb", "mid", "enterprise", "self-serve"]


def psql_table(cols: List[str], rows: List[list]) -> str:
    w = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(cols)]
    out = [" " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(cols)),
           "-" + "-+-".join("-" * x for x in w) + "-"]
    for r in rows:
        out.append(" " + " | ".join(str(v).rjust(w[i]) if isinstance(v, (int, float)) else str(v).ljust(w[i])
                                     for i, v in enumerate(r)))
    out.append(f"({len(rows)} rows)")
    return "\n".join(out)


def make_analyst(rng, count, target) -> Episode:
    forbidden = f"{rng.choice(['crm', 'core', 'legal'])}.{rng.choice(['pii_contacts', 'raw_emails', 'payment_cards'])}_v{rng.randint(2, 9)}"
    schema = f"sandbox_{rng.choice(['q3', 'ops', 'fin', 'growth'])}_{rng.getrandbits(16):04x}"
    prefix = f"{rng.choice(['TST', 'QA', 'ZZ', 'DEMO'])}{rng.randint(1, 9)}-"
    email = f"{rng.choice(['j.moreau', 'p.sato', 'k.osei', 'l.novak', 'r.iyer'])}@{rng.choice(['finops', 'bizops', 'strategy'])}.example.com"
    rules = [
        ("forbidden", f"Never query the table {forbidden}, it holds personal data.",
         "Which table did I tell you never to query? Answer with the table name only.", forbidden),
        ("schema", f"Write any derived tables into the schema {schema}.",
         "Which schema should derived tables be written into? Answer with the schema name only.", schema),
        ("prefix", f"Exclude test accounts, whose customer ids start with {prefix}.",
         "What prefix marks the test accounts to exclude? Answer with the prefix only.", prefix),
        ("email", f"Send the final numbers to {email}.",
         "Who should receive the final numbers? Answer with the email address only.", email),
    ]
    task = ("Prepare the Q3 operations review: shipment dwell times per warehouse, campaign conversions and "
            "customer value by signup month. Rules: " + " ".join(r[1] for r in rules))
    b = Builder(rng, count)
    b.tokens = count(task) + 200
    ep = Episode("analyst", 0, "You are a data analyst agent with read access to the warehouse. Use the tools; "
                 "follow the user's rules.",
                 [tool_spec("run_sql", "Run a read-only SQL query and return the result.", query="SQL text"),
                  tool_spec("read_file", "Read a file from the shared drive.", path="path")], task)
    whs = [f"WH-{c}-{rng.randint(1, 9)}" for c in rng.sample(["BER", "MAD", "OSL", "LYS", "DUB", "WAW", "PRG", "LIS", "AMS", "MIL"], 8)]
    camps = [f"{rng.choice(['spring', 'autumn', 'flash', 'loyalty', 'winback'])}-{rng.getrandbits(16):04x}" for _ in range(6)]
    months = [f"2024-{m:02d}" for m in rng.sample(range(1, 10), 6)]

    def shipments(wh):
        n = rng.randint(12, 18)
        rows = [[f"SH-{rng.randint(100000, 999999)}", wh, f"2024-0{rng.randint(7, 9)}-{rng.randint(1, 28):02d}",
                 round(rng.uniform(1.0, 96.0), 1)] for _ in range(n)]
        q = (f"SELECT shipment_id, warehouse, shipped_on, dwell_hours FROM ops.shipments WHERE warehouse = '{wh}' "
             "AND shipped_on >= '2024-07-01' ORDER BY shipped_on;")
        rows.sort(key=lambda r: r[2])
        med = statistics.median(r[3] for r in rows)
        return q, psql_table(["shipment_id", "warehouse", "shipped_on", "dwell_hours"], rows), f"{med:.2f}", n

    def campaign(c):
        n = rng.randint(12, 18)
        rows = [[f"2024-08-{d + 1:02d}", rng.randint(200, 9000), 0] for d in range(n)]
        for r in rows:
            r[2] = rng.randint(3, max(4, r[1] // 25))
        q = f"SELECT day, sessions, conversions FROM marketing.campaign_daily WHERE campaign = '{c}' ORDER BY day;"
        return q, psql_table(["day", "sessions", "conversions"], rows), str(sum(r[2] for r in rows)), n

    def customers(month):
        n = rng.randint(14, 20)
        rows = []
        for _ in range(n):
            rows.append([f"C-{rng.randint(10000, 99999)}", rng.choice(REGIONS), rng.choice(SEGMENTS),
                         rng.randint(1, 60), f"{rng.uniform(20, 25000):.2f}"])
        rows.sort(key=lambda r: r[0])
        q = (f"SELECT customer_id, region, segment, orders, lifetime_value FROM analytics.customers "
             f"WHERE signup_month = '{month}' ORDER BY customer_id LIMIT {n};")
        return q, rows, psql_table(["customer_id", "region", "segment", "orders", "lifetime_value"], rows)

    # facts: stated (computed by the assistant), middle (a row in a long result), early
    q, out, med, n = shipments(whs[0])
    ep.fact_steps.append(b.call("run_sql", {"query": q}, out,
                                say=f"Across these {n} shipments, the median dwell_hours for {whs[0]} is {med}."))
    ep.questions.append(Question("stated", f"What median dwell_hours did you compute for warehouse {whs[0]}? "
                                           "Answer with the number only.", med, whs[0]))
    for mi in range(2):
        q, rows, out = customers(months[mi])
        idx = rng.randint(int(len(rows) * 0.35), int(len(rows) * 0.65))
        ep.fact_steps.append(b.call("run_sql", {"query": q}, out))
        ep.questions.append(Question("middle", f"What lifetime_value did customer {rows[idx][0]} have in the "
                                               f"{months[mi]} signup cohort? Answer with the number only.",
                                     rows[idx][4], months[mi]))
        if mi == 0:
            q, out, tot, n = campaign(camps[0])
            ep.fact_steps.append(b.call("run_sql", {"query": q}, out,
                                        say=f"Campaign {camps[0]} converted {tot} sessions in total over {n} days."))
            ep.questions.append(Question("stated", f"How many conversions in total did you compute for campaign "
                                                   f"{camps[0]}? Answer with the number only.", tot, camps[0]))
    wi, ci, mi = 1, 1, 2
    while b.tokens < target:
        r = rng.random()
        if r < 0.3:
            wh = whs[1 + (wi - 1) % (len(whs) - 1)]  # never the fact's warehouse again
            wi += 1
            q, out, med, n = shipments(wh)
            b.call("run_sql", {"query": q}, out, say=rng.choice([None, f"{wh} looks in line with the others."]))
        elif r < 0.5:
            c = camps[1 + (ci - 1) % (len(camps) - 1)]
            ci += 1
            q, out, tot, n = campaign(c)
            b.call("run_sql", {"query": q}, out)
        elif r < 0.7:
            q, rows, out = customers(months[2 + (mi - 2) % (len(months) - 2)])
            mi += 1
            b.call("run_sql", {"query": q}, out)
        elif r < 0.85:
            tbl = rng.choice(["ops.shipments", "analytics.customers", "marketing.campaign_daily"])
            plan = [f"Seq Scan on {tbl}  (cost=0.00..{rng.randint(1000, 90000)}.{rng.randint(10, 99)} "
                    f"rows={rng.randint(1000, 900000)} width={rng.randint(20, 90)}) (actual time=0.0{rng.randint(10, 99)}.."
                    f"{rng.randint(10, 900)}.{rng.randint(100, 999)} rows={rng.randint(100, 90000)} loops=1)",
                    f"  Filter: (shipped_on >= '2024-07-01'::date)",
                    f"  Rows Removed by Filter: {rng.randint(1000, 800000)}",
                    f"Planning Time: 0.{rng.randint(100, 999)} ms",
                    f"Execution Time: {rng.randint(5, 4000)}.{rng.randint(100, 999)} ms"]
            b.call("run_sql", {"query": f"EXPLAIN ANALYZE SELECT count(*) FROM {tbl} WHERE shipped_on >= '2024-07-01';"},
                   "\n".join(plan), say=rng.choice([None, "A sequential scan; fine for a one-off report."]))
        else:
            path = f"exports/{rng.choice(camps)}_{rng.choice(months)}.csv"
            rows = ["date,channel,clicks,spend_eur"] + [
                f"2024-08-{d + 1:02d},{rng.choice(['search', 'social', 'email', 'display'])},{rng.randint(10, 9000)},"
                f"{rng.uniform(5, 4000):.2f}" for d in range(rng.randint(10, 16))]
            b.call("read_file", {"path": path}, "\n".join(rows))
    for name, _, q, a in rng.sample(rules, 2):
        ep.questions.append(Question("instruction", q, a, name))
    ep.steps, ep.history_tokens, ep.max_step_tokens = b.steps, b.tokens, b.max_step
    return ep


# ---------------------------------------------------------------------- review
PKGS = ["payments", "ingest", "auth", "storage", "notifications", "search", "billing", "export"]
MODS = ["retry", "client", "cache", "queue", "limits", "worker", "session", "batch", "pool", "codec"]
CONSTS = ["MAX_RETRIES", "BACKOFF_BASE_MS", "BATCH_SIZE", "CACHE_TTL_S", "QUEUE_DEPTH", "POOL_SIZE",
          "READ_TIMEOUT_MS", "FLUSH_INTERVAL_S", "MAX_PAYLOAD_KB", "WORKER_COUNT", "CHUNK_BYTES", "LEASE_SECONDS"]


def py_module(rng: random.Random, path: str):
    """``(text, {CONST: value}, lines, mid_consts)``: constants at the top and one block mid-file."""
    consts = rng.sample(CONSTS, 7)
    vals = {c: str(rng.randint(3, 9999)) for c in consts}
    top, mid = consts[:4], consts[4:]
    L = [f'"""{path.split("/")[-1][:-3].capitalize()} helpers for the {path.split("/")[1]} service."""',
         "from __future__ import annotations", "", "import logging", "import time",
         f"from typing import {rng.choice(['Optional', 'Iterable', 'Sequence'])}", "",
         "log = logging.getLogger(__name__)", ""]
    L += [f"{c} = {vals[c]}" for c in top]

    def func(name):
        body = [f"def {name}(items, *, limit={rng.randint(2, 50)}):",
                f'    """{rng.choice(["Split", "Merge", "Retry", "Flush", "Validate"])} the {rng.choice(["items", "records", "rows"])}."""',
                "    out = []", "    for i, item in enumerate(items):",
                f"        if i >= limit:", "            break",
                f"        if item is None:", f"            log.debug(\"skip %d\", i)", "            continue",
                f"        out.append({rng.choice(['item', 'item.strip()', 'dict(item)', 'item * 2'])})",
                "    return out", ""]
        return [""] + body[:rng.randint(6, len(body))] + ([""] if body[-1] else [])
    names = rng.sample(["split_batches", "merge_pages", "retry_call", "flush_pending", "validate_rows", "drain",
                        "backoff_delay", "encode_frame", "lease_renew", "compact_log"], 6)
    for n in names[:2]:
        L += func(n)
        if not L[-1].startswith("    return"):
            L += ["    return out", ""]
    L += ["", "# tuned for the production load profile"] + [f"{c} = {vals[c]}" for c in mid] + [""]
    for n in names[2:4]:
        L += func(n)
        if not L[-1].startswith("    return"):
            L += ["    return out", ""]
    return "\n".join(L), vals, L, mid


def pytest_run(rng, files) -> str:
    out = [f"============================= test session starts ==============================",
           "platform linux -- Python 3.11.9, pytest-8.2.1, pluggy-1.5.0",
           f"rootdir: /src/app", f"collected {rng.randint(40, 300)} items", ""]
    pct = 0
    for i, f in enumerate(files):
        pct = min(100, pct + rng.randint(8, 30)) if i < len(files) - 1 else 100
        out.append(f"tests/{f} {'.' * rng.randint(5, 30)}{'F' if rng.random() < 0.2 else ''}".ljust(70) + f"[{pct:3d}%]")
    out += ["", "=============================== warnings summary ===============================",
            f"tests/{files[0]}::test_{rng.choice(['roundtrip', 'timeout', 'limits'])}",
            f"  /src/app/.venv/lib/python3.11/site-packages/dateutil/tz/tz.py:37: DeprecationWarning: "
            "datetime.datetime.utcfromtimestamp() is deprecated", "",
            f"=========== {rng.randint(0, 3)} failed, {rng.randint(40, 300)} passed, {rng.randint(1, 4)} warnings "
            f"in {rng.uniform(1, 40):.2f}s ==========="]
    return "\n".join(out)


def make_review(rng, count, target) -> Episode:
    frozen = f"legacy/{rng.choice(['billing_v1', 'old_auth', 'sync_v0', 'ledger_py2'])}/{rng.choice(['core', 'compat', 'shim'])}.py"
    branch = f"{rng.choice(['rv', 'review', 'cr'])}/{rng.choice(['kt', 'mw', 'zs', 'hl'])}{rng.randint(10, 99)}-"
    cov = str(rng.choice([71, 73, 77, 79, 83, 86, 87, 89, 91, 93]))
    label = f"{rng.choice(['blocker', 'must-fix', 'p0'])}-{rng.choice(['sec', 'perf', 'api'])}{rng.randint(2, 9)}"
    rules = [
        ("frozen", f"The file {frozen} is frozen: never comment on it or change it.",
         "Which file is frozen and must never be commented on or changed? Answer with the path only.", frozen),
        ("branch", f"Push any fix-up commits to a branch whose name starts with {branch}.",
         "What prefix must the branch for fix-up commits start with? Answer with the prefix only.", branch),
        ("coverage", f"Do not approve if line coverage is under {cov}%.",
         "Below what line coverage percentage must you not approve? Answer with the number only.", cov),
        ("label", f"Tag every blocking comment with the label {label}.",
         "Which label must every blocking comment carry? Answer with the label only.", label),
    ]
    task = (f"Review pull request #{rng.randint(1000, 9999)} (the {rng.choice(PKGS)} refactor): read the changed "
            "modules, check the diff and the test run, and write review comments. Rules: " + " ".join(r[1] for r in rules))
    b = Builder(rng, count)
    b.tokens = count(task) + 200
    ep = Episode("review", 0, "You are a code review agent. Use the tools to read the repository; follow the user's "
                 "rules.",
                 [tool_spec("read_file", "Read a file of the repository.", path="path"),
                  tool_spec("run", "Run a command in the repository (git, pytest, ruff).", command="the command")], task)
    paths = [f"src/{p}/{m}.py" for p, m in zip(rng.sample(PKGS, 8), rng.sample(MODS, 8))]
    # facts: stated (the assistant restates a top constant), middle (a constant in the mid-file block)
    for i, what in enumerate(["stated", "middle", "stated", "middle"]):
        text, vals, lines, mid = py_module(rng, paths[i])
        if what == "stated":
            c = rng.choice([k for k in vals if k not in mid])
            say = rng.choice([f"In {paths[i]}, {c} is {vals[c]}.", f"{paths[i]} sets {c} = {vals[c]}; noted for the review."])
        else:
            c = rng.choice(mid)
            say = None
        ep.fact_steps.append(b.call("read_file", {"path": paths[i]}, text, say=say))
        ep.questions.append(Question(what, f"What is {c} set to in {paths[i]}? Answer with the value only.", vals[c],
                                     paths[i]))
        if i == 1:
            b.call("run", {"command": "git log --oneline -12"}, "\n".join(
                f"{rng.getrandbits(28):07x} {rng.choice(['fix', 'refactor', 'test', 'chore', 'feat'])}: "
                f"{rng.choice(['tighten', 'rename', 'split', 'cache', 'drop'])} {rng.choice(MODS)} {rng.choice(['path', 'handling', 'defaults', 'helpers'])}"
                for _ in range(12)))
    k = 4
    while b.tokens < target:
        r = rng.random()
        if r < 0.4:
            p = paths[k] if k < 8 else rng.choice(paths[4:] + [f"src/{rng.choice(PKGS)}/{rng.choice(MODS)}.py"])
            if p in paths[:4]:  # never a fact's file again
                p = paths[4]
            k += 1
            text, vals, _, _ = py_module(rng, p)
            b.call("read_file", {"path": p}, text, say=rng.choice([None, None, f"{p} reads fine; no comment needed."]))
        elif r < 0.65:
            p = rng.choice(paths[4:])
            c = rng.choice(CONSTS)
            old, new = rng.randint(3, 999), rng.randint(3, 999)
            hunk = [f"diff --git a/{p} b/{p}", f"index {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644",
                    f"--- a/{p}", f"+++ b/{p}", f"@@ -{rng.randint(5, 60)},9 +{rng.randint(5, 60)},11 @@"]
            for _ in range(rng.randint(6, 14)):
                t = rng.choice([" ", " ", "-", "+"])
                hunk.append(t + rng.choice([f"    out.append(item)", f"    if i >= limit:", "        break",
                                            f"    log.debug(\"skip %d\", i)", f"{c} = {old if t == '-' else new}",
                                            "    return out", f"def {rng.choice(['drain', 'encode_frame'])}(items):"]))
            b.call("run", {"command": f"git diff main...HEAD -- {p}"}, "\n".join(hunk),
                   say=rng.choice([None, "The hunk only moves code around."]))
        elif r < 0.85:
            files = [f"test_{rng.choice(MODS)}.py" for _ in range(rng.randint(5, 9))]
            b.call("run", {"command": "pytest -q -x tests/"}, pytest_run(rng, files))
        else:
            p = rng.choice(paths)
            out = "\n".join(f"{p}:{rng.randint(1, 90)}:{rng.randint(1, 40)}: {rng.choice(['E501 line too long (104 > 100)', 'F401 `time` imported but unused', 'B006 do not use mutable data structures for argument defaults', 'SIM108 use ternary operator'])}"
                            for _ in range(rng.randint(3, 12)))
            b.call("run", {"command": f"ruff check {p}"}, out + f"\nFound {rng.randint(3, 12)} errors.")
    for name, _, q, a in rng.sample(rules, 2):
        ep.questions.append(Question("instruction", q, a, name))
    ep.steps, ep.history_tokens, ep.max_step_tokens = b.steps, b.tokens, b.max_step
    return ep


MAKERS = {"sre": make_sre, "analyst": make_analyst, "review": make_review}


def make_episode(kind: str, seed: int, count, target: int) -> Episode:
    rng = random.Random(f"heldout-{kind}-{seed}")
    ep = MAKERS[kind](rng, count, target)
    ep.seed = seed
    return ep


