"""Training checkpoints: safetensors weights, optimizer state, RNG states and the step, written atomically.

Layout: `<dir>/step-000010/{model.safetensors, config.json, the tokenizer files, optimizer.pt, rng.pt,
state.json}` (with `grpo.lora`: peft's adapter_model.safetensors and adapter_config.json instead of the
weights; resume wraps the base first). A checkpoint is complete only once renamed into place, so a run killed mid-write resumes
from the previous one. The newest `keep` checkpoints are kept.
"""
from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch


def save_checkpoint(directory: str | Path, step: int, model, chat, optimizer, extra: dict | None = None,
                    keep: int = 2, protected: tuple[int, ...] = ()) -> Path:
    """Write step `step`'s checkpoint; then remove all but the newest `keep` and the `protected` steps."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}.", dir=directory))
    getattr(model, "module", model).save_pretrained(tmp, safe_serialization=True)
    chat.tokenizer.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
               tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **(extra or {})}))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    keep_names = {f"step-{s:06d}" for s in protected}
    for old in sorted(directory.glob("step-*"))[:-keep]:
        if old.name not in keep_names:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = sorted(p for p in Path(directory).glob("step-*") if (p / "state.json").exists())
    return found[-1] if found else None


def restore_weights(path: str | Path, model) -> None:
    """Load a checkpoint's weights (or, with grpo.lora, its adapter) into `model` in place."""
    from safetensors.torch import load_file

    path = Path(path)
    if (path / "adapter_model.safetensors").exists():  # grpo.lora: peft saved only the adapter
        from tasks.policy.lora import restore_adapter

        restore_adapter(model, path)
    else:
        getattr(model, "module", model).load_state_dict(load_file(path / "model.safetensors"))


def restore_checkpoint(path: str | Path, model, optimizer) -> dict:
    """Load weights, optimizer and RNG states in place; returns the saved state (with `step`)."""
    path = Path(path)
    restore_weights(path, model)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    return json.loads((path / "state.json").read_text())
