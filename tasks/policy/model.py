"""Hugging Face causal LMs: build the tiny default from config, save, and load from a dir, s3:// or models:/.

A model directory is a standard Hugging Face checkpoint: `save_pretrained` of the model (config.json,
generation_config.json, model.safetensors) and of its tokenizer with its chat template, plus
checksums.json (and the toolset it was trained for; for a LoRA-trained model, `adapter/`: the adapter
with a reference to its base). The embedded default is a Llama-architecture model
(about 0.9M parameters) with the character-level tokenizer of tasks/policy/tokenizer.py; nothing is
downloaded. Any other causal LM with a tool-calling chat template loads the same way (`model.name_or_path`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tasks import storage
from tasks.policy.chat import ChatFormat

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from tasks.config_sections import ModelSettings

ADAPTER_DIR = "adapter"  # a LoRA-trained model keeps the adapter it was merged from here (tasks/policy/lora.py)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_model(
    model_settings: ModelSettings, chat: ChatFormat | None = None, env_name: str | None = None
) -> tuple[PreTrainedModel, ChatFormat]:
    """(the tiny Llama of the embedded default with random weights, its ChatFormat); the tokenizer is
    `model.tokenizer`'s, a BPE learning its merges from `env_name`'s demonstrations (None: the default
    environment's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tasks.policy.tokenizer import default_tokenizer

    chat = chat or ChatFormat(default_tokenizer(model_settings, env_name), model_settings.tool_call_parser)
    tok = chat.tokenizer
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=model_settings.hidden_size,
        intermediate_size=model_settings.intermediate_size,
        num_hidden_layers=model_settings.num_layers,
        num_attention_heads=model_settings.num_heads,
        num_key_value_heads=model_settings.num_heads,
        max_position_embeddings=model_settings.max_len,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=chat.pad_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(model_settings.seed)
    return LlamaForCausalLM(cfg), chat


def save_model(
    model: PreTrainedModel,
    chat: ChatFormat,
    directory: str | Path,
    toolset: dict | None = None,
    adapter: str | Path | None = None,
) -> Path:
    """Write atomically: a half-written model directory is never visible under its final name.

    `toolset` is the version of the tool registry the model was trained for, kept beside the weights so that a
    later tool change can be diffed against it (tasks.envs.toolset.toolset_of_model). `adapter`: a LoRA
    adapter directory (tasks/policy/lora.save_adapter) the weights were merged from, kept as `adapter/`.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        chat.tokenizer.save_pretrained(tmp)
        if toolset is not None:
            from tasks.envs.toolset import TOOLSET_FILENAME

            (tmp / TOOLSET_FILENAME).write_text(json.dumps(toolset, indent=1))
        if adapter is not None:
            shutil.copytree(adapter, tmp / ADAPTER_DIR)
        storage.write_manifest(tmp)  # checked by load_model: a corrupted artifact is refused
        return storage.publish_dir(tmp, directory)
    except BaseException:  # a full disk, a kill: the half-written copy goes, the old model stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_engine_support(config: dict) -> None:
    """Refuse, before any compute, a model config vLLM cannot run on this machine: an architecture outside
    vLLM's registry, or on CPU a head size its attention kernels lack (ModelFormatError naming the field)."""
    import torch
    import vllm
    from vllm.model_executor.models import ModelRegistry

    from tasks.policy.chat import ModelFormatError

    archs = config.get("architectures") or []
    if not set(archs) & set(ModelRegistry.get_supported_archs()):
        raise ModelFormatError(
            f"model.name_or_path: architecture {archs} is not one vLLM {vllm.__version__} runs; "
            "pick a supported model or set rollout.backend=hf (transformers generate)"
        )
    if not torch.cuda.is_available():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head not in sizes:
            raise ModelFormatError(
                f"model: head size {head} (hidden_size / num_heads) is not one vLLM's CPU attention "
                f"runs ({sizes}); change model.hidden_size or model.num_heads, or rollout.backend=hf"
            )


def resolve_model_dir(uri: str | Path, cache_dir: str | Path | None = None, revision: str | None = None) -> Path:
    """A local directory for `uri`: a path, `s3://bucket/prefix` (boto3), `models:/name@alias` (MLflow), or a
    Hugging Face Hub id (`org/name`, at `revision`) where a hub is reachable."""
    return _model_of_mlmodel(_resolve(str(uri), cache_dir, revision))


def _model_of_mlmodel(directory: Path) -> Path:
    """An MLflow model of the transformers flavor (what the registry holds, Tracker.log_model) keeps the model
    directory under `model/`; any other directory is the model itself."""
    inner = directory / "model"
    return inner if (directory / "MLmodel").exists() and (inner / "config.json").exists() else directory


def _resolve(uri: str, cache_dir: str | Path | None, revision: str | None) -> Path:
    if uri.startswith("models:/") or uri.startswith("runs:/"):
        import mlflow

        try:
            return Path(
                mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(cache_dir) if cache_dir else None)
            )
        except mlflow.exceptions.MlflowException as e:
            raise FileNotFoundError(
                f"{uri} is not in the MLflow registry at {mlflow.get_tracking_uri()}: "
                f"check the name and alias or version ({e.message.splitlines()[0]})"
            ) from e
    if uri.startswith("s3://"):
        prefix = uri.rstrip("/") + "/"
        files = storage.list_files(prefix)
        if not files:
            raise FileNotFoundError(f"no objects under {uri}: expected a saved model directory there")
        dest = Path(cache_dir or tempfile.mkdtemp(prefix="evergreen-model-")).resolve()
        for file_uri in files:
            target = storage.inside_dir(dest, file_uri[len(prefix) :], what=f"object {file_uri}")
            target.parent.mkdir(parents=True, exist_ok=True)
            storage.write_atomic(target, storage.read_bytes(file_uri))
        return dest
    path = Path(uri)
    if not path.exists() and _looks_like_hub_id(uri):
        return _hub_snapshot(uri, revision, cache_dir)
    if not (path / "config.json").exists() and not (path / "MLmodel").exists():
        raise FileNotFoundError(
            f"{path} is not a saved model directory (no config.json); run `python -m tasks bootstrap` first"
        )
    return path


def _looks_like_hub_id(uri: str) -> bool:
    parts = uri.split("/")
    return len(parts) == 2 and all(parts) and not uri.startswith((".", "~"))


def _hub_snapshot(repo_id: str, revision: str | None, cache_dir: str | Path | None) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=str(cache_dir) if cache_dir else None))
    except Exception as e:
        raise FileNotFoundError(
            f"model.name_or_path={repo_id!r} is neither a local model directory nor a "
            f"Hugging Face Hub model this machine can download ({type(e).__name__}: {e})"
        ) from e


def load_model(
    uri: str | Path,
    cache_dir: str | Path | None = None,
    model_settings: ModelSettings | None = None,
    checksums: bool = True,
) -> tuple[PreTrainedModel, ChatFormat, Path]:
    """(model in eval mode, its ChatFormat, local directory) for a model URI. The checksums written by
    save_model are verified (storage.ChecksumError for a changed or missing file; `checksums=False` only for
    a team's own checkpoint, which Evergreen did not save); `model_settings` gives dtype, revision,
    trust_remote_code and the tool-call parser (their defaults without it)."""
    from transformers import AutoModelForCausalLM

    from tasks.config import ModelSettings

    ms = model_settings or ModelSettings()
    directory = resolve_model_dir(uri, cache_dir, ms.revision)
    if checksums:
        storage.verify_manifest(directory)
    chat = ChatFormat.load(directory, ms.tool_call_parser, ms.revision, ms.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        directory, dtype=DTYPES[ms.dtype], revision=ms.revision, trust_remote_code=ms.trust_remote_code
    )
    model.eval()
    return model, chat, directory


def state_dict_cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors under Hugging Face names (what engines load)."""
    return {k: v.to("cpu") for k, v in state_dict_snapshot(model).items()}


def state_dict_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached, contiguous copies under Hugging Face names, on the model's device: a snapshot the next
    optimizer step does not change (GPU to GPU transfers send these without a trip through the CPU)."""
    model = getattr(model, "module", model)  # unwrap DDP
    return {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
