import json

import pytest

from pykvcompact.chat.tool_calls import parse_tool_calls

TOOLS = [{"type": "function", "function": {"name": "read_file"}}, {"type": "function", "function": {"name": "compact_conversation"}}]


def args(c):
    return json.loads(c["function"]["arguments"])


def test_qwen_tool_call_tags():
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "Let me look."
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"]
    assert calls[0]["function"]["name"] == "read_file" and args(calls[0]) == {"path": "a.py"}


def test_several_and_unclosed_tags():
    text = ('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>\n'
            '<tool_call>{"name": "compact_conversation", "arguments": {}}')
    content, calls = parse_tool_calls(text, TOOLS)
    assert content is None and [c["function"]["name"] for c in calls] == ["read_file", "compact_conversation"]


@pytest.mark.parametrize("text", [
    '{"name": "read_file", "arguments": {"path": "x"}}',
    '```json\n{"name": "read_file", "parameters": {"path": "x"}}\n```',
    '{"function": {"name": "read_file", "arguments": "{\\"path\\": \\"x\\"}"}}',
    '{"tool_calls": [{"function": {"name": "read_file", "arguments": {"path": "x"}}}]}',
    '[{"name": "read_file", "arguments": {"path": "x"}}]',
])
def test_plain_json_forms(text):
    content, calls = parse_tool_calls(text, TOOLS)
    assert content is None and len(calls) == 1 and args(calls[0]) == {"path": "x"}


@pytest.mark.parametrize("text", [
    "Just text.", '{"name": "unknown_tool", "arguments": {}}', '{"answer": 42}', "<tool_call>not json</tool_call>",
    '{"name": "read_file", "arguments": {"path": "x"}} and more text', "",
])
def test_not_tool_calls(text):
    content, calls = parse_tool_calls(text, TOOLS)
    assert calls == [] and content == text


def test_without_tool_list_any_name_counts():
    content, calls = parse_tool_calls('<tool_call>{"name": "anything", "arguments": {}}</tool_call>')
    assert calls[0]["function"]["name"] == "anything" and calls[0]["function"]["arguments"] == "{}"
