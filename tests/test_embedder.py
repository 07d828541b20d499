"""Which models run from their transformer alone: read from the model directory's own files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mnemoplan.inference.embedder import plain_mean_pooling
from mnemoplan.inference.forward import st_plain_parts

TYPES = ["Transformer", "Pooling", "Normalize"]


def model_dir(root: Path, *, types: list[str] = TYPES, pooling: str = "pooling_mode_mean_tokens",
              settings: dict[str, object] | None = None, config: dict[str, object] | None = None) -> Path:  # fmt: skip
    root.mkdir()
    modules = [{"idx": i, "name": str(i), "path": ["", "1_Pooling", "2_Normalize"][i],
                "type": f"sentence_transformers.models.{t}"} for i, t in enumerate(types)]  # fmt: skip
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_Pooling").mkdir()
    modes = {m: m == pooling for m in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens")}
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 384, **modes}))
    body = {"max_seq_length": 256, "do_lower_case": False} if settings is None else settings
    (root / "sentence_bert_config.json").write_text(json.dumps(body))
    (root / "config.json").write_text(json.dumps(config or {"model_type": "bert", "hidden_size": 384}))
    return root


def test_a_plain_mean_pooling_model_is_recognised(tmp_path: Path) -> None:
    assert plain_mean_pooling(str(model_dir(tmp_path / "m"))) == 256


@pytest.mark.parametrize(
    "variant",
    [
        {"types": ["Transformer", "Pooling"]},  # not normalised
        {"types": ["Transformer", "Pooling", "Dense", "Normalize"][:3]},
        {"pooling": "pooling_mode_cls_token"},
        {"settings": {"max_seq_length": 256, "do_lower_case": True}},
        {"settings": {"do_lower_case": False}},  # no length
        {"settings": {"max_seq_length": 128, "do_lower_case": False, "model_args": {"x": 1}}},
        {"config": {"model_type": "t5", "is_encoder_decoder": True}},  # its encoder alone is the embedder
    ],
)
def test_any_other_model_goes_through_sentence_transformers(tmp_path: Path, variant: dict[str, object]) -> None:
    assert plain_mean_pooling(str(model_dir(tmp_path / "m", **variant))) is None  # type: ignore[arg-type]


def test_a_model_with_a_default_prompt_goes_through_sentence_transformers(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    (root / "config_sentence_transformers.json").write_text(json.dumps({"default_prompt_name": None}))
    assert plain_mean_pooling(str(root)) == 256
    (root / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "q: "},
                                                                       "default_prompt_name": "query"}))  # fmt: skip
    assert plain_mean_pooling(str(root)) is None


def test_a_directory_without_the_files_is_not_plain(tmp_path: Path) -> None:
    assert plain_mean_pooling(str(tmp_path)) is None
    (tmp_path / "modules.json").write_text("not json")
    assert plain_mean_pooling(str(tmp_path)) is None


class Loaded(list):  # type: ignore[type-arg]
    """A stand-in for a loaded sentence-transformers model: a list of its modules."""

    default_prompt_name: str | None = None


def loaded(*names: str, lower: bool = False, mode: str = "mean", prompt: str | None = None) -> Loaded:
    modules = Loaded(type(name, (), {})() for name in names)
    modules[0].__dict__.update(tokenizer="tok", auto_model="bert", max_seq_length=128, do_lower_case=lower)
    if len(modules) > 1:
        modules[1].__dict__.update(pooling_mode=mode)
    modules.default_prompt_name = prompt
    return modules


def test_a_loaded_plain_model_runs_directly_and_anything_else_does_not() -> None:
    assert st_plain_parts(loaded("Transformer", "Pooling", "Normalize")) == ("tok", "bert", 128)
    assert st_plain_parts(loaded("Transformer", "Pooling", "Normalize", lower=True)) is None  # it lowercases
    assert st_plain_parts(loaded("Transformer", "Pooling", "Normalize", "Dense")) is None  # a module more
    assert st_plain_parts(loaded("Transformer", "Pooling", "Normalize", mode="cls")) is None
    assert st_plain_parts(loaded("Transformer", "Pooling")) is None
    assert st_plain_parts(loaded("Transformer", "Pooling", "Normalize", prompt="query")) is None
