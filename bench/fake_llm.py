#!/usr/bin/env python3
"""A scripted stand-in for an LLM server, to run ``mnemoplan bench --llm`` end to end without a model.

    python bench/fake_llm.py --api openai --port 8799 &
    MNEMOPLAN_LLM_PROVIDER=openai MNEMOPLAN_LLM_BASE_URL=http://127.0.0.1:8799/v1 \\
        MNEMOPLAN_LLM_MODEL=fake mnemoplan bench --llm --out /tmp/bench-llm

It serves the tests' loopback server (``tests/llm_server.py``: the OpenAI chat-completions or
the Anthropic Messages API) and answers every role with a valid, empty-handed reply: no facts
extracted, the rules' own plan back, "sufficient", no expansion, every memory scored alike.
So its quality figures are the offline ones by construction; what the run shows is the
plumbing (extraction settled before the questions, every request in the call log, the cost
table). ``--bad`` makes it answer like a small model at its worst instead (prose, fences,
truncated objects, refusals, in turn), to watch every degradation at work. It knows nothing:
quality with a real model must be measured with one (README: Use your own LLM).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.llm_corpus import UNUSABLE  # noqa: E402
from tests.llm_server import LoopbackLLMServer, Reply  # noqa: E402


def system_and_prompt(server: LoopbackLLMServer, body: dict[str, Any]) -> tuple[str, str]:
    return server.system_prompt(body), server.user_prompt(body)


def answer(server: LoopbackLLMServer, body: dict[str, Any]) -> Reply:
    """A valid reply for the role the system prompt names; tokens counted as ~4 characters each."""
    system, prompt = system_and_prompt(server, body)
    tokens_in = (len(system) + len(prompt)) // 4
    if system.startswith("You extract"):
        text = json.dumps({"facts": []})
    elif system.startswith("You judge"):
        text = json.dumps({"sufficient": True, "confidence": 0.5, "diagnosis": "as found"})
    elif system.startswith("You help search"):
        text = json.dumps({"rewrite": "", "hypothetical": ""})
    elif system.startswith(("You plan", "You revise")):
        found = re.search(r"(?:deep_plan \(baseline\)|1\.) (\{.*\})", prompt)
        text = found.group(1) if found else "{}"
    else:  # rerank: every id listed, scored alike
        text = json.dumps({"scores": {i: 5 for i in re.findall(r"\[([0-9a-f]{8,})\]", prompt)}})
    return Reply(text=text, input_tokens=tokens_in, output_tokens=len(text) // 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--bad", action="store_true", help="answer like a small model at its worst")
    args = parser.parse_args()
    server = LoopbackLLMServer(api=args.api)
    bad = itertools.cycle(UNUSABLE.values())
    server.responder = (lambda _: next(bad)) if args.bad else (lambda body: answer(server, body))
    server.start(args.port)
    print(f"fake LLM ({args.api}) at {server.base_url}", file=sys.stderr, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
