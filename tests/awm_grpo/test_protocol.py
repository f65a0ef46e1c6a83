"""The tool-call parser on valid and malformed replies, meta-tool resolution, the catalogue text."""

from __future__ import annotations

import pytest

from awm_grpo.protocol import (
    InvalidCall,
    ToolCall,
    parse_reply,
    resolve_meta_call,
    split_thinking,
    tool_catalogue,
)


def test_plain_text_is_the_final_answer_thinking_included():
    reply = parse_reply("<think>\nmaybe call a tool\n</think>\n\nThe answer is 4.")
    assert reply.is_final and reply.final_answer.endswith("The answer is 4.") and not reply.calls


def test_calls_inside_thinking_are_not_executed():
    reply = parse_reply('<think><tool_call>{"name": "x", "arguments": {}}</tool_call></think>Done.')
    assert reply.is_final


def test_several_calls_in_order_with_object_or_string_arguments():
    reply = parse_reply('text <tool_call>\n{"name": "a", "arguments": {"k": 1}}\n</tool_call>'
                        '<tool_call>{"name": "b", "arguments": "{\\"k\\": [2]}"}</tool_call>'
                        '<tool_call>{"name": "c"}</tool_call>')
    assert reply.calls == [ToolCall("a", {"k": 1}), ToolCall("b", {"k": [2]}), ToolCall("c", {})]


@pytest.mark.parametrize("body, reason", [
    ('{"name": "a", "arguments": {', "not valid JSON"),
    ("", "not valid JSON"),
    ('"just a string"', "must be a JSON object"),
    ('{"name": 3}', 'needs a "name"'),
    ('{"name": "  "}', 'needs a "name"'),
    ('{"name": "a", "arguments": [1]}', '"arguments" must be a JSON object'),
    ('{"name": "a", "arguments": "[1]"}', '"arguments" must be a JSON object'),
    ('{"name": "a", "arguments": "{bad"}', "string that is not valid JSON"),
])
def test_malformed_blocks_become_invalid_calls_with_a_reason(body, reason):
    reply = parse_reply(f"<tool_call>{body}</tool_call>")
    assert not reply.is_final and len(reply.calls) == 1
    assert isinstance(reply.calls[0], InvalidCall) and reason in reply.calls[0].reason


def test_an_unclosed_block_is_invalid_not_a_final_answer():
    reply = parse_reply('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b"')
    assert reply.calls[0] == ToolCall("a", {}) and isinstance(reply.calls[1], InvalidCall)
    assert "not closed" in reply.calls[1].reason


def test_repeat_key_ignores_key_order_but_not_values():
    assert ToolCall("a", {"x": 1, "y": 2}).key() == ToolCall("a", {"y": 2, "x": 1}).key()
    assert ToolCall("a", {"x": 1}).key() != ToolCall("a", {"x": "1"}).key()


def test_meta_calls_resolve_to_environment_calls():
    assert resolve_meta_call(ToolCall("list_tools", {})) == ToolCall("list_tools", {})
    assert resolve_meta_call(ToolCall("call_tool", {"tool_name": "get", "arguments": {"id": 1}})) == \
        ToolCall("get", {"id": 1})
    assert resolve_meta_call(ToolCall("call_tool", {"tool_name": "get", "arguments": '{"id": 1}'})) == \
        ToolCall("get", {"id": 1})
    for bad in (ToolCall("get", {}), ToolCall("call_tool", {}), ToolCall("call_tool", {"tool_name": "g", "arguments": 5})):
        assert isinstance(resolve_meta_call(bad), InvalidCall)


def test_split_thinking_uses_the_last_closing_tag():
    assert split_thinking("a</think>b</think>c") == ("a</think>b</think>", "c")
    assert split_thinking("no thinking") == ("", "no thinking")


def test_catalogue_lists_parameters_with_required_flags():
    text = tool_catalogue([{"name": "get_book", "description": "Get a book.\nMore.", "inputSchema": {
        "type": "object", "properties": {"book_id": {"type": "integer", "description": "id"},
                                         "fields": {"type": "string", "enum": ["a", "b"], "default": "a"}},
        "required": ["book_id"]}}, {"name": "ping", "description": "", "inputSchema": {}}])
    assert "1. get_book: Get a book." in text and "- book_id: integer (required) id" in text
    assert "- fields: string (optional) one of ['a', 'b'] default \"a\"" in text and "(no parameters)" in text
