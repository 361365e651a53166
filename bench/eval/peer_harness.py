"""The peer: llama-cpp-python's ``Llama`` used the way agent harnesses use it today.

One KV sequence with Llama's prefix reuse (only the suffix after the longest cached prefix is evaluated).
When the rendered conversation would pass 85% of the window, the harness stops, asks for a summary with a
separate prompt ([system][history][summarize request], reusing the cached history), waits for it, and
re-prefills [system][summary][the most recent 10% of the window] (only the system prompt is reused).
"""
from __future__ import annotations

import time
from typing import List

SUMMARIZE = ("Pause. Write a summary of the conversation above so that the work can continue from it alone: "
             "the goal, every verified result with its exact value (numbers, codes, names), the user's "
             "instructions word for word, and the next step. Plain text, no tool calls.")
HARD, KEEP_RECENT = 0.85, 0.10


class PeerHarness:
    def __init__(self, llm, template, *, window: int, system: str, tools: List[dict], summary_tokens: int):
        import llama_cpp

        self.llm, self.tpl, self.window, self.tools = llm, template, window, tools
        self.summary_tokens = summary_tokens
        self.system = {"role": "system", "content": system}
        self.messages: List[dict] = [self.system]
        self.dropped: List[dict] = []
        self.summaries: List[str] = []
        self.compactions: List[dict] = []      # {"fill", "stall_ms", "when": "add" | "reply"}
        self.tokens = {"prefill": 0, "decode": 0}
        self.truncated = 0                      # messages dropped because even the compacted context overflowed
        self._is_eog = lambda t: llama_cpp.llama_vocab_is_eog(llm._model.vocab, t)

    # ---------------------------------------------------------------- tokens
    def _tokens(self, messages, gen: bool) -> List[int]:
        text = self.tpl.render(messages, self.tools, add_generation_prompt=gen)
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _prefill(self, toks: List[int], keep_last_for_logits: bool) -> None:
        """Evaluate what the cache does not hold yet (the longest common prefix is reused)."""
        llm, n = self.llm, 0
        cached = llm.input_ids[:llm.n_tokens]
        while n < min(len(cached), len(toks)) and cached[n] == toks[n]:
            n += 1
        if keep_last_for_logits and n == len(toks):
            n -= 1
        llm.n_tokens = n
        if toks[n:]:
            llm.eval(toks[n:])
            self.tokens["prefill"] += len(toks) - n

    def _generate(self, messages, max_tokens: int, grammar=None) -> str:
        toks = self._tokens(messages, gen=True)
        self._prefill(toks, keep_last_for_logits=True)
        out: List[int] = []
        for tok in self.llm.generate([], reset=False, temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                     repeat_penalty=1.0, grammar=grammar):
            if self._is_eog(tok):
                break
            out.append(tok)
            if len(out) >= max_tokens:
                break
        self.tokens["decode"] += len(out)
        return self.llm.detokenize(out).decode("utf-8", errors="ignore")

    @property
    def fill(self) -> float:
        return self.llm.n_tokens / self.window

    # ---------------------------------------------------------------- the harness
    def add(self, msgs: List[dict], reserve: int) -> bool:
        """Append messages; compact first when they would pass 85% of the window. True if it compacted."""
        compacted = False
        if len(self._tokens(self.messages + msgs, gen=True)) + reserve > HARD * self.window:
            self._compact("add")
            compacted = True
        # a harness must fit its window: when summary + recent + the new messages still do not, the oldest
        # recent messages go (truncation), counted in ``truncated``
        while (len(self.messages) > 2 and
               len(self._tokens(self.messages + msgs, gen=True)) + reserve > self.window):
            self.dropped.append(self.messages.pop(2))
            self.truncated += 1
        self.messages.extend(msgs)
        return compacted

    def reply(self, max_tokens: int, grammar: str = None) -> str:
        import llama_cpp

        g = llama_cpp.LlamaGrammar.from_string(grammar, verbose=False) if grammar else None
        text = self._generate(self.messages, max_tokens, g)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def _compact(self, when: str) -> None:
        t0 = time.perf_counter()
        fill = len(self._tokens(self.messages, gen=False)) / self.window
        summary = self._generate(self.messages + [{"role": "user", "content": SUMMARIZE}], self.summary_tokens)
        recent: List[dict] = []
        budget = KEEP_RECENT * self.window
        for m in reversed(self.messages[1:]):
            if len(self._tokens([m], gen=False)) > budget:
                break
            budget -= len(self._tokens([m], gen=False))
            recent.insert(0, m)
        while recent and recent[0]["role"] == "tool":   # never start on a tool result without its call
            recent.pop(0)
        kept = len(self.messages) - len(recent)
        self.dropped.extend(self.messages[1:kept])
        self.summaries.append(summary)
        self.messages = [self.system, {"role": "user", "content": "[Summary of the conversation so far]\n" + summary}]
        self.messages += recent
        self._prefill(self._tokens(self.messages, gen=False), keep_last_for_logits=False)   # the re-prefill
        self.compactions.append({"fill": round(fill, 4), "stall_ms": (time.perf_counter() - t0) * 1000.0,
                                 "when": when})
