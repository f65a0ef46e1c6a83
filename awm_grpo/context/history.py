"""The numbered conversation of a context-managed episode, and how it is shown to the model.

Every message has an id, in order: the system prompt 0, the task 1, then each assistant turn and each tool
result. The model reads the ids in the tool results (`{"msg_id": 5, "msg_id(invoking_assistant)": 4, ...}`,
StateLM's fields) and passes one to `deleteContext`. A deleted message stays in the history (the trace keeps
it) but renders as a stub, and the task message carries an external-memory block listing the notes; both
change only when the conversation is rendered again, which the loop does after a deletion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from awm_grpo.context.tools import STUB

INVOKER = "msg_id(invoking_assistant)"


@dataclass
class Message:
    id: int
    role: str  # system | user | assistant | tool
    content: str  # assistant: the reply text; tool: the result text as the tool gave it
    tool: str | None = None  # tool results: the tool's name
    invoker: int | None = None  # tool results: the id of the assistant turn that called it


class History:
    """The episode's messages by id, the deleted ids, and their rendering (module docstring)."""

    def __init__(self, task: str) -> None:
        self.messages = [Message(0, "system", ""), Message(1, "user", task)]
        self.deleted: set[int] = set()

    def add_assistant(self, content: str) -> int:
        self.messages.append(Message(len(self.messages), "assistant", content))
        return len(self.messages) - 1

    def add_tool(self, text: str, tool: str | None, invoker: int) -> str:
        """Record a tool result; returns the content the model reads for it (its JSON with the ids)."""
        message = Message(len(self.messages), "tool", text, tool, invoker)
        self.messages.append(message)
        return self.tool_content(message)

    def deletable(self, msg_id: int) -> str | None:
        """None when `msg_id` may be deleted, else why not (the agent reads it as the tool's error)."""
        if not 0 <= msg_id < len(self.messages):
            return f"there is no message {msg_id}: ids run from 0 to {len(self.messages) - 1}"
        if msg_id < 2:
            return f"message {msg_id} is the {'system prompt' if msg_id == 0 else 'task'} and cannot be deleted"
        if msg_id in self.deleted:
            return f"message {msg_id} is already deleted"
        return None

    def delete(self, ids: list[int]) -> None:
        self.deleted.update(ids)

    def tool_content(self, message: Message) -> str:
        if message.id in self.deleted:
            body: dict[str, Any] = {"status": "deleted", "message": STUB, "original_tool": message.tool}
        else:
            try:
                parsed = json.loads(message.content)
            except ValueError:
                parsed = None
            body = parsed if isinstance(parsed, dict) else {"result": message.content}
        return json.dumps({"msg_id": message.id, INVOKER: message.invoker, **body}, ensure_ascii=False)

    def render(self, notes: dict[str, dict[str, Any]] | None) -> list[dict[str, Any]]:
        """The chat messages after the system prompt (the encoder adds it): the task with the notes block,
        then every turn, deleted ones as stubs. `notes` None: no memory tools, no block."""
        task = self.messages[1].content + (memory_block(notes) if notes is not None else "")
        out: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for m in self.messages[2:]:
            if m.role == "assistant":
                out.append({"role": "assistant", "content": STUB if m.id in self.deleted else m.content})
            else:
                out.append({"role": "tool", "content": self.tool_content(m)})
        return out


def memory_block(notes: dict[str, dict[str, Any]]) -> str:
    """The external-memory block appended to the task: each note's key and summary."""
    lines = [f"- {key}: {note.get('summary', '')}" for key, note in notes.items()]
    body = "\n".join(lines) if lines else "(no notes yet)"
    return f"\n\n<external_memory>\nYour notes (readNote(key) shows one in full):\n{body}\n</external_memory>"
