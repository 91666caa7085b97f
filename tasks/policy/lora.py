"""LoRA for GRPO (`grpo.lora`): peft trains an adapter on the frozen policy, the engines take each policy
version as a vLLM LoRA adapter instead of full weights.

    model = wrap(model, settings.grpo.lora)          # a peft model: only the adapter's tensors train
    adapter = adapter_state(model)                   # {"config": ..., "tensors": ...}: what a sync moves
    write_adapter(directory, adapter)                # the directory vLLM's LoRARequest reads
    save_adapter(model, directory, base_dir)         # the challenger's adapter, with a reference to its base

vLLM loads an adapter only from a directory (`LoRARequest(name, id, path)`), so a sync sends the tensors
through the object store and every engine writes them to its own temporary directory. A sync moves
2·r·(d_in + d_out) values per target module instead of the whole model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from peft import PeftModel

    from tasks.config_grpo import LoraSettings

# vLLM's accepted `max_lora_rank` values (vllm/config/lora.py): an engine is built with the smallest one
# that holds the adapter's rank
ENGINE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
BASE_FILE = "base.json"


def engine_rank(rank: int) -> int:
    """The `max_lora_rank` an engine needs for an adapter of `rank`."""
    for r in ENGINE_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"grpo.lora.rank={rank} exceeds vLLM's largest LoRA rank {ENGINE_RANKS[-1]}: lower it")


def wrap(model: torch.nn.Module, lora_settings: LoraSettings) -> PeftModel:
    """`model` under a fresh peft LoRA adapter (B = 0: the wrapped model computes exactly what `model` did)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora_settings.rank,
        lora_alpha=lora_settings.alpha,
        target_modules=list(lora_settings.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    missing = [
        m for m in config.target_modules if not any(name.split(".")[-1] == m for name, _ in model.named_modules())
    ]
    if missing:
        raise ValueError(
            f"grpo.lora.target_modules: {type(model).__name__} has no module named {', '.join(missing)}; "
            "list its linear layers (e.g. q_proj, v_proj)"
        )
    return get_peft_model(model, config)


def adapter_config(model: PeftModel) -> dict:
    """The adapter's `adapter_config.json` as a dict (JSON types only)."""
    config = model.peft_config["default"].to_dict()
    return json.loads(json.dumps(config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def adapter_state(model: PeftModel) -> dict:
    """What a sync moves: the adapter's config and CPU copies of its tensors (peft's names, as saved)."""
    from peft import get_peft_model_state_dict

    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in get_peft_model_state_dict(model).items()}
    return {"config": adapter_config(model), "tensors": tensors}


def adapter_bytes(adapter: dict) -> int:
    return sum(t.numel() * t.element_size() for t in adapter["tensors"].values())


def write_adapter(directory: str | Path, adapter: dict) -> Path:
    """The two files vLLM and peft read: adapter_config.json and adapter_model.safetensors."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps(adapter["config"], indent=1))
    save_file(adapter["tensors"], str(directory / "adapter_model.safetensors"))
    return directory


def base_reference(base_dir: str | Path) -> dict:
    """Which model an adapter applies to: its path and the sha256 of its checksum manifest (which pins
    every file of it), and the toolset it was trained for when recorded."""
    from tasks.storage import MANIFEST, sha256_file

    base_dir = Path(base_dir)
    manifest = base_dir / MANIFEST
    return {"path": str(base_dir), "manifest_sha256": sha256_file(manifest) if manifest.exists() else None}


def save_adapter(model: PeftModel, directory: str | Path, base_dir: str | Path) -> Path:
    """The trained adapter as peft saves it, its base named in `adapter_config.json` and `base.json`."""
    adapter = adapter_state(model)
    base = base_reference(base_dir)
    adapter["config"]["base_model_name_or_path"] = base["path"]
    directory = write_adapter(directory, adapter)
    (directory / BASE_FILE).write_text(json.dumps(base, indent=1))
    return directory


def restore_adapter(model: PeftModel, directory: str | Path) -> None:
    """Load a checkpoint's adapter tensors into the peft `model` in place."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(str(Path(directory) / "adapter_model.safetensors")))
    if unexpected := getattr(result, "unexpected_keys", None):
        raise ValueError(
            f"{directory}: adapter tensors {unexpected[:3]} do not fit this model (grpo.lora changed "
            "since the checkpoint?): remove the run's checkpoints or restore the settings"
        )


class BaseOf:
    """The peft model with its adapter switched off: the frozen base as the KL reference, without a second
    copy of the weights in memory (called like a model; not a module, so the policy's parameters are not
    listed twice)."""

    def __init__(self, peft_model: PeftModel) -> None:
        self.peft_model = peft_model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.peft_model.disable_adapter():
            return self.peft_model(*args, **kwargs)
