"""The embedding model exported once to ONNX, from its own weights, and cached.

``cached_export`` finds the graph exported for a model directory, or exports it in a child
process (``python -m mnemoplan.inference.onnx_export``): torch and transformers, which only the
export needs, never load into the server. The export is checked against torch's own output
before it is kept; a model that cannot be exported, or whose export differs, is run by torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = 1  # changes whenever the export below would write a different graph
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
PROBES = [  # texts whose vectors the export must reproduce: short, long, a batch padded
    "hi",
    "Caroline went to the LGBTQ support group yesterday and said it was powerful.",
    "What did I tell you last spring about moving to Lisbon with my partner, the dog and two cats, "
    "and which neighbourhood did we finally choose after all those visits?",
]
MIN_COSINE = 0.9999


class ExportFailed(RuntimeError):
    """The model could not be exported to ONNX, or its export does not give torch's vectors."""


def export_key(model_dir: Path) -> str:
    """What identifies a model's export: its config, its weights' names, sizes and times, the format."""
    digest = hashlib.sha256(f"format {FORMAT}".encode())
    digest.update((model_dir / "config.json").read_bytes())
    for name in WEIGHTS:
        path = model_dir / name
        if path.is_file():
            stat = path.stat()
            digest.update(f"{name} {stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def cached_export(model_dir: Path, cache_dir: Path, *, name: str = "", timeout_s: float = 600.0) -> Path:
    """The ONNX graph of ``model_dir`` (called ``name`` in the cache), exported now if ``cache_dir``
    does not hold it yet.

    Two processes exporting at once both write a whole file and rename it into place: the
    last rename wins, and either file is the same export.

    Raises:
        ExportFailed: The export failed, timed out, or does not reproduce torch's vectors.
        OSError: The model's files cannot be read, or the cache cannot be written.
    """
    label = "".join(c if c.isalnum() or c in "-_." else "_" for c in name or model_dir.name)
    target = cache_dir / f"{label}-{export_key(model_dir)}.onnx"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.stem}-{uuid.uuid4().hex}.tmp")
    log.info("exporting the embedding model to ONNX once (%s); it is cached in %s", model_dir.name, cache_dir)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mnemoplan.inference.onnx_export", str(model_dir), str(partial)],
            capture_output=True, text=True, timeout=timeout_s, check=False,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )  # fmt: skip
        if done.returncode != 0 or not partial.is_file():
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise ExportFailed(f"the ONNX export of {model_dir.name} failed: {last}")
        os.replace(partial, target)
    except subprocess.TimeoutExpired as exc:
        raise ExportFailed(f"the ONNX export of {model_dir.name} took over {timeout_s:.0f} s") from exc
    finally:
        partial.unlink(missing_ok=True)
    return target


def export(model_dir: Path, target: Path) -> float:
    """Export the transformer of ``model_dir`` to ``target`` and check it against torch; returns
    the lowest cosine between the two runtimes' mean-pooled vectors over ``PROBES``.

    Raises:
        ExportFailed: the export's vectors differ from torch's.
    """
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class LastHidden(torch.nn.Module):
        """The transformer's last hidden layer, its inputs passed by keyword (newer transformers
        refuse positional extras)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:  # fmt: skip
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    batch = tokenizer(PROBES, return_tensors="pt", padding=True)
    with torch.inference_mode():  # before the export: tracing leaves the model changed
        expected = model(**batch).last_hidden_state.numpy()
    sample = tokenizer(PROBES[:2], return_tensors="pt", padding=True)
    axes = {name: {0: "batch", 1: "tokens"} for name in [*names, "last_hidden_state"]}
    with torch.inference_mode():
        torch.onnx.export(LastHidden(), tuple(sample[n] for n in names), str(target), input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)  # fmt: skip
    import onnxruntime as ort

    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    got = session.run(None, {n: batch[n].numpy() for n in names})[0]
    mask = batch["attention_mask"].numpy()[..., None]
    a, b = (expected * mask).sum(1), (got * mask).sum(1)
    cosine = float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())
    if cosine < MIN_COSINE:
        target.unlink(missing_ok=True)
        raise ExportFailed(f"the export's vectors differ from torch's (cosine {cosine:.6f})")
    return cosine


def main(argv: list[str] | None = None) -> int:
    """``python -m mnemoplan.inference.onnx_export MODEL_DIR TARGET``: export, check, print the cosine."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m mnemoplan.inference.onnx_export MODEL_DIR TARGET.onnx", file=sys.stderr)
        return 2
    import warnings

    warnings.filterwarnings("ignore")  # the tracer's notes on code paths the inputs never take
    os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"  # the model is local
    try:
        cosine = export(Path(args[0]), Path(args[1]))
    except ExportFailed as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(json.dumps({"min_cosine": cosine}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
