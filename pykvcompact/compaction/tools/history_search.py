"""The ``search_history`` tool: the agent looks up what compaction took out of its context.

Summarizing is not forgetting: every message a swap replaced is in the history file, verbatim.  A summary
can still drop a fact the task needs later; this tool lets the model find it again, as an agent greps its
offload files.  The query's words, numbers, ids and paths are matched against the lines of the offloaded
messages (case-insensitive); lines are ranked by the rarity of the terms they contain (BM25's idf: a term
found on every line, like "total", counts for little, an account id for a lot) and returned grouped by
message, newest first within a score, within a token budget so that a result never crowds out the work.
A tool result's lines also get half the weight of the terms its call's arguments match (the call names the
file or the account; the line with the value does not repeat it): "max_pool_size services/auth/config.toml"
ranks the auth config's ``max_pool_size = 47`` above the same key in another file.
"""
from __future__ import annotations

import bisect
import json
import math
import re
from typing import Callable, List, Optional, Sequence, Tuple

NAME = "search_history"
NOTHING_OFFLOADED = "Nothing has been compacted yet: the whole conversation is still in context."

DESCRIPTION = ("Search the earlier messages that were compacted out of the context (saved verbatim) for "
               "words, numbers, ids or paths; returns the matching lines.")

TOOL = {
    "type": "function",
    "function": {
        "name": NAME,
        "description": DESCRIPTION,
        "parameters": {"type": "object",
                       "properties": {"query": {"type": "string", "description": "what to look for"}},
                       "required": ["query"]},
    },
}

# words that carry no information about *which* message is meant
STOP_WORDS = _STOP = frozenset("""a an and are as at be by did do does for from had has have how i in is it its me my
of on or our so than that the their them then there these this those to us was we were what when where
which who why will with you your""".split())
_TERM = re.compile(r"[\w][\w.\-/:]*[\w]|[\w]")
MAX_TERMS = 24          # a longer query is searched by its first 24 terms
QUOTE = 60              # characters of the query quoted back in a result
LONG_LINE = 240         # characters: a longer line is shown as an excerpt around its matches
SHOWN_MIN = 12          # characters: a shorter compacted line found inside the context's text is not "shown" there
MIN_EXCERPT = 60        # characters: the narrowest excerpt tried for a best line that does not fit
CALL_WEIGHT = 0.5       # of a term's weight, for a tool result's line whose call's arguments match the term


def is_search_call(call: dict) -> bool:
    f = call.get("function", call) if isinstance(call, dict) else {}
    return isinstance(f, dict) and f.get("name") == NAME


def query_of(call: dict) -> Tuple[Optional[str], str]:
    """``(query, "")`` from a tool call's arguments, or ``(None, why)`` when they are unusable."""
    f = call.get("function", call) if isinstance(call, dict) else {}
    args = f.get("arguments") if isinstance(f, dict) else None
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError:
            return None, "the arguments are not valid JSON"
    if not isinstance(args, dict):
        return None, "the arguments must be an object with a \"query\" string"
    q = args.get("query")
    if not isinstance(q, str) or not q.strip():
        return None, "a non-empty \"query\" string is required"
    return q, ""


def terms(query: str) -> List[str]:
    """The query's search terms: lower-cased words, numbers, ids and paths, without stop words and single
    letters (all words when nothing else is left), at most :data:`MAX_TERMS`."""
    found = [t.strip(".-/:") or t for t in _TERM.findall(query.lower())]
    found = list(dict.fromkeys(t for t in found if t))
    useful = [t for t in found if t not in _STOP and (len(t) > 1 or t.isdigit())]
    out = []
    for t in useful or found:  # a run of CJK text is a sentence, not a word: search its character pairs
        out += [t[i:i + 2] for i in range(len(t) - 1)] if len(t) > 3 and _cjk(t) else [t]
    return list(dict.fromkeys(out))[:MAX_TERMS]


def _cjk(term: str) -> bool:
    return any(ord(c) > 0x2E7F for c in term)


def _pattern(term: str) -> "re.Pattern":
    """Where ``term`` starts a word (a letter or digit before it does not; "_" separates, as in
    build_1234).  A short term must end one too ("id" is not "idea"); a longer one may be a prefix
    (invoice: invoices, 2024-01-05: 2024-01-05T10:00Z).  Text without spaces (Chinese, Japanese) is
    matched anywhere."""
    body = re.escape(term)
    if _cjk(term):  # CJK and later blocks: no word boundaries to rely on
        return re.compile(body, re.IGNORECASE)
    end = r"(?![^\W_])" if len(term) < 4 else ""
    return re.compile(r"(?<![^\W_])" + body + end, re.IGNORECASE)


def _parts(msg: dict) -> List[Tuple[str, bool]]:
    """``(text, is_call)``: a message's content, then one text per call to another tool (a search's own
    call and result are never searched: they would echo earlier results back ahead of the original)."""
    content = msg.get("content")
    parts = [(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False), False)] if content else []
    for tc in msg.get("tool_calls") or []:
        f = tc.get("function", {}) if isinstance(tc, dict) else {}
        if f.get("name") != NAME:
            parts.append((f"{f.get('name', '?')}({f.get('arguments', '')})", True))
    return parts


def message_text(msg: dict) -> str:
    """A message's searchable text: its content and its calls to other tools."""
    return "\n".join(text for text, _ in _parts(msg))


def _calls_of(messages: Sequence[Tuple[int, dict]]) -> dict:
    """``id(tool result message) -> "name(arguments)"``: the call each result answers, the nearest one before
    it with its id (ids repeat: ``call_0`` after a restart)."""
    latest, out = {}, {}
    for _, m in messages:
        for tc in m.get("tool_calls") or []:
            f = tc.get("function", {}) if isinstance(tc, dict) else {}
            if isinstance(f, dict) and tc.get("id") is not None:
                latest[str(tc["id"])] = f"{f.get('name', '?')}({f.get('arguments', '')})"
        if m.get("role") == "tool" and str(m.get("tool_call_id", "")) in latest:
            out[id(m)] = latest[str(m.get("tool_call_id", ""))]
    return out


def searchable(msg: dict) -> bool:
    return not (msg.get("role") == "tool" and msg.get("name") == NAME)


def _excerpt(line: str, pats: Sequence["re.Pattern"], width: int = LONG_LINE) -> str:
    """``line``, or for a long one the ``width`` characters that hold the most of the query's terms (``pats``,
    rarest first: a tie goes to the window with the rarer term), starting a little before a match (a
    value follows its key: ``"percent_covered_display": "57.77"``).  One pass over the matches."""
    if len(line) <= width:
        return line
    spans = sorted((m.start(), m.end(), r) for r, p in enumerate(pats) for m in p.finditer(line))
    margin = min(8, width // 8)
    best, at = None, 0
    inside: dict = {}          # rank -> matches of it in the window
    hi = 0
    lo = 0
    for start, _, _ in spans:
        s0 = max(0, start - margin)
        while lo < len(spans) and spans[lo][0] < s0:      # matches that begin before the window leave it
            if lo < hi:
                r = spans[lo][2]
                inside[r] -= 1
                if not inside[r]:
                    del inside[r]
            lo += 1
        hi = max(hi, lo)
        while hi < len(spans) and spans[hi][1] <= s0 + width:
            inside[spans[hi][2]] = inside.get(spans[hi][2], 0) + 1
            hi += 1
        if inside:
            key = (len(inside), -min(inside))
            if best is None or key > best:
                best, at = key, s0
    start = min(at, max(0, len(line) - width))
    end = min(len(line), start + width)
    return ("..." if start else "") + line[start:end] + ("..." if end < len(line) else "")


def _head(index: int, msg: dict) -> str:
    name = f" ({msg['name']})" if msg.get("name") else ""
    return f"[message {index}, {msg.get('role', '?')}{name}]"


def quote_query(query: str) -> str:
    q = " ".join(query.split())
    return repr(q if len(q) <= QUOTE else q[:QUOTE] + "...")


def search(messages: Sequence[Tuple[int, dict]], query: str, *, budget: int,
           count: Callable[[str], int] = lambda s: len(s) // 4 + 1) -> str:
    """The result text for ``query`` over ``messages`` (``(transcript index, message)``, oldest first):
    the best lines grouped under their message's header, at most ``budget`` tokens by ``count``."""
    return search_result(messages, query, budget=budget, count=count)[0]


def _lines_of(msg: dict) -> List[Tuple[str, bool]]:
    """``(line, is_call)`` for each non-empty line of a message's searchable text (:func:`message_text`)."""
    return [(ln, is_call) for text, is_call in _parts(msg) for ln in text.splitlines() if ln.strip()]


def corpus(messages: Sequence[Tuple[int, dict]]) -> List[tuple]:
    """The searchable lines of ``messages`` (``(transcript index, message)``): ``(index, message, line,
    is_call)`` each.  A caller that searches the same messages again and again (the recall) keeps it."""
    return [(idx, msg, ln, is_call) for idx, msg in messages if searchable(msg) for ln, is_call in _lines_of(msg)]


def search_result(messages: Sequence[Tuple[int, dict]], query: str, *, budget: int,
                  count: Callable[[str], int] = lambda s: len(s) // 4 + 1,
                  context: Sequence[dict] = (), anchors: Sequence[str] = (),
                  lines_of_messages: Optional[List[tuple]] = None) -> Tuple[str, int]:
    """``(text, lines shown)``: see :func:`search`.

    ``context`` (the recall's use): the messages the model sees now.  Their lines are ranked with the
    others (they count in the terms' rarity) and set the bar: only a compacted line that ranks above every
    line of the context is returned, and only if the context does not show it already, so nothing is
    returned when the context holds evidence as good (``("", 0)``).  Neither side counts the lines of the
    agent's own calls (what it asked for, not what it learned: the call's arguments still rank its
    result's lines) nor, as the bar, the lines the user wrote (where a question comes from, not its
    answer; a summary quotes them too).  ``anchors`` (names, required with ``context``): only the lines that
    match one of their terms (themselves, or through their call's arguments) count, as evidence and as the
    bar; the query's other words ("reply with the value only") rank them but are no evidence on their own.
    ``lines_of_messages``: :func:`corpus` of ``messages``, when the caller has it."""
    messages = [(i, m) for i, m in messages if searchable(m)]
    if not messages:
        return NOTHING_OFFLOADED, 0
    want = terms(query)
    if not want:
        return f"The query {quote_query(query)} has no words to search for: name a value, id, path or word.", 0
    rows = corpus(messages) if lines_of_messages is None else lines_of_messages
    rows = rows + [(LIVE, m, ln, is_call) for m in context for ln, is_call in _lines_of(m)]
    lines = [(idx, msg, ln) for idx, msg, ln, _ in rows]
    calls_at = {k for k, row in enumerate(rows) if row[3]}
    n_off = sum(1 for idx, _, _ in lines if idx != LIVE)
    ranked = _rank(lines, want, list(messages) + [(LIVE, m) for m in context])
    if ranked is None:
        return (f"No compacted message matches {quote_query(query)} ({len(messages)} messages searched). The summary "
                "above and the recent messages are all the context there is.", 0)
    score, matched, pats, idf, occurrences = ranked
    if context:
        score = _better_than_context(lines, n_off, score, matched, calls_at, {t for a in anchors for t in terms(a)})
        if not score:
            return "", 0
    scored = sorted(((sc, lines[k][0], k) for k, sc in score.items()), key=lambda x: (-x[0], -x[1], x[2]))
    # the excerpt of a long line holds the most terms, the rarest first: fewest occurrences in all the lines
    rare = [pats[t] for t in sorted(idf, key=lambda t: (-idf[t], occurrences[t]))]
    intro = f"Matches for {quote_query(query)} in the compacted messages (best first):"
    footer = "({} more matching lines not shown: refine the query)"
    used = count(intro) + count(footer.format(len(scored)))
    picked: dict = {}
    shown_text: dict = {}
    shown = 0
    for _, idx, k in scored:
        head = 0 if idx in picked else count(_head(idx, lines[k][1]))
        shown_text[k] = _excerpt(lines[k][2], rare)
        cost = count(shown_text[k]) + head
        width = LONG_LINE
        while used + cost > budget and not shown and width > MIN_EXCERPT:   # the best line, narrower
            width = width * 3 // 4
            shown_text[k] = _excerpt(lines[k][2], rare, width)
            cost = count(shown_text[k]) + head
        if used + cost > budget:
            if shown:
                break
            continue  # a line that cannot fit even alone: try the next one
        picked.setdefault(idx, []).append(k)
        used += cost
        shown += 1
    if not shown:
        return (f"The lines matching {quote_query(query)} are too long to show in {budget} tokens; search for something "
                "more specific.", 0)
    rank = {k: r for r, (_, _, k) in enumerate(scored)}
    out = [intro]
    for idx in sorted(picked, key=lambda i: min(rank[k] for k in picked[i])):
        out.append(_head(idx, lines[picked[idx][0]][1]))
        out.extend(shown_text[k] for k in sorted(picked[idx]))
    if len(scored) > shown:
        out.append(footer.format(len(scored) - shown))
    return "\n".join(out), shown


LIVE = -1   # the transcript index given to the context's lines


def _better_than_context(lines, n_off: int, score: dict, matched: dict, calls_at: set, anchor_terms: set) -> dict:
    """The scores of the compacted lines (the first ``n_off``) that are about an anchor, rank above every
    line of the context that is (but the user's), are not calls, and that the context does not show."""
    about = {k: sc for k, sc in score.items() if matched[k] & anchor_terms and k not in calls_at}
    asked = {_norm(ln) for _, m, ln in lines if m.get("role") == "user" and not m.get("summary")}
    bar = max((sc for k, sc in about.items() if k >= n_off and _norm(lines[k][2]) not in asked), default=0.0)
    live = [_norm(lines[k][2]) for k in range(n_off, len(lines))]
    live_text = "\n".join(live)
    # a long line the context shows as an excerpt ("...key": value, ...): its core is part of the original
    cores = [ln.strip(".") for ln in live if (ln.startswith("...") or ln.endswith("...")) and len(ln) >= 40]
    out = {}
    for k, sc in about.items():
        if k >= n_off or sc <= bar:
            continue
        line = _norm(lines[k][2])
        if (len(line) >= SHOWN_MIN and line in live_text) or any(c in line for c in cores):
            continue   # shown already (in a line of its own, a summary's listing, an earlier recall)
        out[k] = sc
    return out


def _norm(line: str) -> str:
    return " ".join(line.split())


def _rank(lines, want: Sequence[str], messages: Sequence[Tuple[int, dict]]):
    """Each line's score for the query terms ``want``: the rarity (BM25's idf over ``lines``) of the terms
    it contains, plus :data:`CALL_WEIGHT` of those its call's arguments match.  ``(score, matched terms,
    patterns, idf, occurrences)`` by line index, or ``None`` when no line matches any term.  Each term is
    searched once over all the text (its matches mapped to their lines), not line by line."""
    n = len(lines)
    joined = "\n".join(ln for _, _, ln in lines)
    starts, at = [], 0
    for _, _, ln in lines:
        starts.append(at)
        at += len(ln) + 1
    pats = {t: _pattern(t) for t in want}
    matched: dict = {}
    counts, occurrences = {}, {}
    for t in want:
        found, hits = set(), 0
        for m in pats[t].finditer(joined):
            found.add(bisect.bisect_right(starts, m.start()) - 1)
            hits += 1
        counts[t], occurrences[t] = len(found), hits
        for k in found:
            matched.setdefault(k, set()).add(t)
    # BM25's idf; a term on more than half the lines tells little (a tenth of its weight)
    idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) * (1.0 if c <= n / 2 else 0.1)
           for t, c in counts.items() if c}
    if not idf:
        return None
    score = {k: sum(idf[t] for t in ts) for k, ts in matched.items()}
    calls = _calls_of(messages)
    in_call: dict = {}   # call text -> the terms its arguments match (one search per call, not per line)
    for k in list(score):   # a line that matches on its own also gets what its call's arguments match
        call = calls.get(id(lines[k][1]))
        if call:
            if call not in in_call:
                in_call[call] = {t for t in idf if pats[t].search(call)}
            extra = in_call[call] - matched[k]
            if extra:
                score[k] += CALL_WEIGHT * sum(idf[t] for t in extra)
                matched[k] = matched[k] | extra
    return score, matched, pats, idf, occurrences


__all__ = ["corpus", "quote_query", "message_text", "NAME", "TOOL", "DESCRIPTION", "NOTHING_OFFLOADED", "is_search_call", "query_of", "terms", "search",
           "search_result", "searchable"]
