"""Readers of chat exports: ChatGPT's and Claude.ai's ``conversations.json``, and the generic
JSONL of messages the bench reads (``bench/datasets.py``).

ChatGPT keeps each conversation as a tree (``mapping``: node id -> message, parent, children),
branching wherever a reply was regenerated or a message edited; the conversation as its user last
saw it is the path from ``current_node`` up to the root. Claude keeps a list (``chat_messages``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, Any

from mnemoplan.transfer.sources import Bad, Conversation, Item, Message, digest, epoch_time, iso_time, json_items, json_lines

CHATGPT_ROLES = {"user": "user", "assistant": "assistant"}  # system prompts and tool output are not conversation
CLAUDE_SENDERS = {"human": "user", "assistant": "assistant"}


def _chatgpt_text(content: Any) -> str:
    """The text of a ChatGPT message's ``content``: its string parts (images and files are dicts)."""
    if not isinstance(content, dict):
        raise ValueError("content is not an object")
    parts = content.get("parts")
    if isinstance(parts, list):
        return "\n".join(p for p in parts if isinstance(p, str)).strip()
    text = content.get("text")
    return text.strip() if isinstance(text, str) else ""


def _chatgpt_path(mapping: dict[str, Any], current: Any) -> list[str]:
    """Node ids of the branch the user last saw, root first; every node by time without a current node."""
    if isinstance(current, str) and current in mapping:
        path, seen, node = [], set(), current
        while isinstance(node, str) and node in mapping and node not in seen:
            seen.add(node)
            path.append(node)
            parent = mapping[node].get("parent") if isinstance(mapping[node], dict) else None
            node = parent
        return path[::-1]

    def when(nid: str) -> float:
        msg = mapping[nid].get("message") if isinstance(mapping[nid], dict) else None
        stamp = msg.get("create_time") if isinstance(msg, dict) else None
        return float(stamp) if isinstance(stamp, int | float) else 0.0

    return sorted(mapping, key=when)


def _opened(
    conv: Any, where: str, source: str, *, messages: tuple[str, type, str], time: tuple[str, Callable[[Any], Any]],
    ids: tuple[str, ...], title: str,
) -> tuple[Conversation, Any] | Bad:
    """A conversation of a chat export, empty, and when it started; or why it cannot be read.

    Args:
        messages: The key of its messages, their container's type, and the problem when absent.
        time: The key of its start and how to read it (raises ValueError).
        ids: Keys that may hold its id, in order (else a digest of its title and start).
        title: The key of its title.
    """
    key, kind, missing = messages
    if not isinstance(conv, dict) or not isinstance(conv.get(key), kind):
        return Bad(where, missing)
    try:
        started = time[1](conv.get(time[0]))
    except ValueError as exc:
        return Bad(where, str(exc))
    cid = next((conv[k] for k in ids if conv.get(k)), None) or digest(str(conv.get(title)), str(started))
    name = conv.get(title) if isinstance(conv.get(title), str) else ""
    return Conversation(f"{where} ({name or cid})", f"{source}:{cid}", name, []), started


def chatgpt(stream: IO[bytes]) -> Iterator[Item]:
    """Conversations of a ChatGPT export's ``conversations.json``."""
    for n, conv in json_items(stream, "conversations.json"):
        where = f"conversation {n}"
        opened = _opened(conv, where, "chatgpt", messages=("mapping", dict, "no 'mapping' of messages"),
                         time=("create_time", epoch_time), ids=("conversation_id", "id"), title="title")  # fmt: skip
        if isinstance(opened, Bad):
            yield opened
            continue
        out, started = opened
        mapping = conv["mapping"]
        for nid in _chatgpt_path(mapping, conv.get("current_node")):
            node = mapping[nid]
            msg = node.get("message") if isinstance(node, dict) else None
            if msg is None:
                continue  # the root and other empty nodes
            try:
                if not isinstance(msg, dict) or not isinstance(msg.get("author"), dict):
                    raise ValueError("no author")
                role = msg["author"].get("role")
                meta = msg.get("metadata") if isinstance(msg.get("metadata"), dict) else {}
                if role not in CHATGPT_ROLES or meta.get("is_visually_hidden_from_conversation"):
                    continue
                text = _chatgpt_text(msg.get("content"))
                when = epoch_time(msg.get("create_time")) or started
            except ValueError as exc:
                out.problems.append(f"{where}, message {nid}: {exc}")
                continue
            if text:
                out.messages.append(Message(text, CHATGPT_ROLES[role], when, str(msg.get("id") or nid)))
        yield out


def _claude_text(msg: dict[str, Any]) -> str:
    text = msg.get("text")
    if isinstance(text, str) and text.strip():
        return text.strip()
    blocks = msg.get("content")
    if isinstance(blocks, list):
        return "\n".join(b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"
                         and isinstance(b.get("text"), str)).strip()  # fmt: skip
    return ""


def claude(stream: IO[bytes]) -> Iterator[Item]:
    """Conversations of a Claude.ai export's ``conversations.json``."""
    for n, conv in json_items(stream, "conversations.json"):
        where = f"conversation {n}"
        opened = _opened(conv, where, "claude", messages=("chat_messages", list, "no 'chat_messages' list"),
                         time=("created_at", iso_time), ids=("uuid",), title="name")  # fmt: skip
        if isinstance(opened, Bad):
            yield opened
            continue
        out, started = opened
        for i, msg in enumerate(conv["chat_messages"]):
            try:
                if not isinstance(msg, dict) or msg.get("sender") not in CLAUDE_SENDERS:
                    raise ValueError("no sender 'human' or 'assistant'")
                when = iso_time(msg.get("created_at")) or started
            except ValueError as exc:
                out.problems.append(f"{where}, message {i}: {exc}")
                continue
            text = _claude_text(msg)
            if text:
                source = str(msg.get("uuid") or digest(cid, str(i), text))
                out.messages.append(Message(text, CLAUDE_SENDERS[msg["sender"]], when, source))
        yield out


def generic_jsonl(stream: IO[bytes]) -> Iterator[Item]:
    """Messages of the bench's generic JSONL (conv_id, session, dia_id, speaker, text, timestamp,
    blip_caption), one session per (conv_id, session), in the order first seen. The file is read
    whole before the first session is yielded: a session's lines need not be together."""
    sessions: dict[tuple[str, str], Conversation] = {}
    for n, row in json_lines(stream):
        if isinstance(row, Bad):
            yield row
            continue
        text, conv = row.get("text"), row.get("conv_id")
        if not isinstance(text, str) or conv is None or row.get("session") is None:
            yield Bad(f"line {n}", "needs conv_id, session and text")
            continue
        try:
            when = iso_time(row.get("timestamp"))
        except ValueError as exc:
            yield Bad(f"line {n}", str(exc))
            continue
        caption = row.get("blip_caption")
        if isinstance(caption, str) and caption:
            text = f"{text} [image: {caption}]"
        key = (str(conv), str(row["session"]))
        if key not in sessions:
            sessions[key] = Conversation(f"line {n} (conversation {key[0]}, session {key[1]})",
                                         f"{key[0]}:{key[1]}", "", [])  # fmt: skip
        source = str(row.get("dia_id") or f"line-{n}")
        sessions[key].messages.append(Message(text, str(row.get("speaker") or ""), when, source))
    for conv_session in sessions.values():  # a message without a time takes its session's first one
        first = next((m.occurred_at for m in conv_session.messages if m.occurred_at), None)
        for m in conv_session.messages:
            m.occurred_at = m.occurred_at or first
        yield conv_session
