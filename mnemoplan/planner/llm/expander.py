"""The LLM as query expander: a keyword rewrite for BM25 and a hypothetical memory for vectors (HyDE).

A question and the memory that answers it rarely share their wording ("What does Mel do
to relax?" against "painting calms me down"). The rewrite adds the words the answer
would likely use; the hypothetical memory is a made-up line in the voice of a stored
message, whose embedding sits nearer the real answer than the question's does. Both only
add candidates next to the original query's; neither replaces it.
"""

from __future__ import annotations

import json

from pydantic import BaseModel

from mnemoplan.model import QueryAnalysis
from mnemoplan.inference.llm import LLMClient
from mnemoplan.inference.llm_json import JSON_ONLY
from mnemoplan.planner.llm.prompts import analysis_json
from mnemoplan.planner.llm.protocols import Expansion

MAX_CHARS = 500  # of each expansion; longer replies are cut

EXPANDER_SYSTEM = (
    "You help search a person's long-term memory of conversations. For the query, write (1) a keyword "
    "rewrite: the query's names and terms plus the words a message answering it would likely contain, and "
    "(2) a hypothetical memory: one short message, in the first person as it might have been said in "
    "the conversation, that would answer the query (invent plausible details; it is only used to search). "
    + JSON_ONLY
    + ' Schema: {"rewrite": "<keywords>", "hypothetical": "<one message>"}'
)


class _ExpansionReply(BaseModel):
    rewrite: str = ""
    hypothetical: str = ""


class LLMExpander:
    """Asks the LLM for a keyword rewrite and a hypothetical memory of one query.

    Args:
        client: The shared LLM client.
        max_tokens: Cap on the reply's length.
    """

    def __init__(self, client: LLMClient, *, max_tokens: int = 300) -> None:
        self._client = client
        self._max_tokens = max_tokens

    def expand(self, query: str, analysis: QueryAnalysis, *, deadline: float | None = None) -> Expansion:
        """The query's expansions; ``deadline`` is the ``time.monotonic()`` instant the LLM's answer
        must come by.

        Raises:
            LLMError: the call failed or the reply did not match the schema, even after a repair;
                the caller searches with the query alone and says so.
        """
        prompt = f"Query: {json.dumps(query, ensure_ascii=False)}\nAnalysis: {analysis_json(analysis)}"
        reply = self._client.complete_json(
            system=EXPANDER_SYSTEM, prompt=prompt, max_tokens=self._max_tokens, purpose="expand",
            deadline=deadline, schema=_ExpansionReply,
        )
        parsed: _ExpansionReply = reply.value
        return Expansion(
            rewrite=" ".join(parsed.rewrite.split())[:MAX_CHARS],
            hypothetical=" ".join(parsed.hypothetical.split())[:MAX_CHARS],
            usage=reply.usage,
        )
