"""Hugging Face causal LMs: build the tiny default from config, save, and load from a dir, s3:// or models:/.

The embedded default is a Llama-architecture model (about 0.9M parameters) with the character
tokenizer of tasks/policy/tokenizer.py; nothing is downloaded. A model directory is a plain
`save_pretrained` folder (config.json + model.safetensors) plus `evergreen_tokenizer.json`.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from tasks import storage
from tasks.policy.tokenizer import CharTokenizer


def build_model(model_settings, tokenizer: CharTokenizer | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or CharTokenizer()
    cfg = LlamaConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=model_settings.hidden_size,
        intermediate_size=model_settings.intermediate_size, num_hidden_layers=model_settings.num_layers,
        num_attention_heads=model_settings.num_heads, num_key_value_heads=model_settings.num_heads,
        max_position_embeddings=model_settings.max_len, bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id, tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(model_settings.seed)
    return LlamaForCausalLM(cfg), tokenizer


def save_model(model, tokenizer: CharTokenizer, directory: str | Path, toolset: dict | None = None) -> Path:
    """Write atomically: a half-written model directory is never visible under its final name.

    `toolset` is the version of the tool registry the model was trained for, kept beside the weights so that a
    later tool change can be diffed against it (tasks.envs.toolset.toolset_of_model).
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save(tmp)
    if toolset is not None:
        from tasks.envs.toolset import TOOLSET_FILENAME

        (tmp / TOOLSET_FILENAME).write_text(json.dumps(toolset, indent=1))
    storage.write_manifest(tmp)  # checked by load_model: a corrupted artifact is refused
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
        directory.rename(old)
        tmp.rename(directory)
        import shutil
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(directory)
    return directory


def resolve_model_dir(uri: str | Path, cache_dir: str | Path | None = None) -> Path:
    """A local directory for `uri`: a path, `s3://bucket/prefix` (boto3) or `models:/name@alias` (MLflow)."""
    uri = str(uri)
    if uri.startswith("models:/") or uri.startswith("runs:/"):
        import mlflow

        return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(cache_dir) if cache_dir else None))
    if uri.startswith("s3://"):
        prefix = uri.rstrip("/") + "/"
        files = storage.list_files(prefix)
        if not files:
            raise FileNotFoundError(f"no objects under {uri}: expected a saved model directory there")
        dest = Path(cache_dir or tempfile.mkdtemp(prefix="evergreen-model-"))
        for file_uri in files:
            target = dest / file_uri[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(storage.read_bytes(file_uri))
        return dest
    path = Path(uri)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a saved model directory (no config.json); run `python -m tasks bootstrap` first")
    return path


def load_model(uri: str | Path, cache_dir: str | Path | None = None):
    """(model in eval mode, tokenizer, local directory) for a model URI; refuses files whose sha256
    differs from the checksums.json written by save_model (storage.ChecksumError)."""
    from transformers import AutoModelForCausalLM

    directory = resolve_model_dir(uri, cache_dir)
    storage.verify_manifest(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    return model, CharTokenizer.load(directory), directory


def state_dict_cpu(model) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors under Hugging Face names (what engines load)."""
    return {k: v.to("cpu") for k, v in state_dict_snapshot(model).items()}


def state_dict_snapshot(model) -> dict[str, torch.Tensor]:
    """Detached, contiguous copies under Hugging Face names, on the model's device: a snapshot the next
    optimizer step does not change (GPU to GPU transfers send these without a trip through the CPU)."""
    model = getattr(model, "module", model)  # unwrap DDP
    return {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
