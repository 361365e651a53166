"""The deterministic environment an episode runs against.

Small models do not call tools reliably, so the environment drives the episode: each step is sent to the
session as the assistant's scripted tool call and the tool's result (``{"role": "tool", "tool_call_id":
...}``), then the model replies.  When a reply calls a tool itself, the environment answers that call
(from the script when the call matches a scripted step, else with a short refusal), so the conversation
stays well formed and the model's own calls are never left unanswered.
"""
from __future__ import annotations

import json
from typing import List

from .episode import Episode, Step


class Environment:
    def __init__(self, episode: Episode):
        self.episode = episode
        self._by_call = {(s.tool, json.dumps(s.args, sort_keys=True)): s.output for s in episode.steps}
        self.model_calls = 0         # tool calls the model made on its own
        self.model_calls_matched = 0  # ... that matched a scripted step

    def step_messages(self, index: int, step: Step) -> List[dict]:
        """The user turn (if any), the scripted tool call, its result and the assistant's statement (if any)."""
        call_id = f"call_{index}"
        call = {"id": call_id, "type": "function",
                "function": {"name": step.tool, "arguments": json.dumps(step.args)}}
        out = [{"role": "user", "content": step.user}] if step.user else []
        return out + [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": call_id, "name": step.tool, "content": step.output}] + (
            [{"role": "assistant", "content": step.say}] if step.say else [])

    def answer(self, reply_message: dict) -> List[dict]:
        """Tool results for the calls the model made in its reply."""
        out = []
        for call in reply_message.get("tool_calls") or []:
            fn = call.get("function", {})
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except (TypeError, ValueError):
                args = None
            key = (fn.get("name"), json.dumps(args, sort_keys=True))
            self.model_calls += 1
            if key in self._by_call:
                self.model_calls_matched += 1
                content = self._by_call[key]
            else:
                content = "This call is not available now; the environment continues with the plan."
            out.append({"role": "tool", "tool_call_id": call.get("id", "call_model"), "name": fn.get("name"),
                        "content": content})
        return out
