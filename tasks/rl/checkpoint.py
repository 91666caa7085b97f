"""Training checkpoints: safetensors weights, optimizer state, RNG states and the step, written atomically.

Layout: `<dir>/step-000010/{model.safetensors, config.json, the tokenizer files, optimizer.pt, rng.pt (torch's
RNG), rng.json (Python's and numpy's), state.json}` (with `grpo.lora`: peft's adapter_model.safetensors and
adapter_config.json instead of the weights; resume wraps the base first). Every .pt loads with
weights_only=True: a checkpoint directory never gets arbitrary objects unpickled. A checkpoint is complete only once renamed into place, so a run killed mid-write resumes
from the previous one. The newest `keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from tasks.policy.chat import ChatFormat


def save_checkpoint(
    directory: str | Path,
    step: int,
    model: torch.nn.Module,
    chat: ChatFormat,
    optimizer: torch.optim.Optimizer,
    extra: dict | None = None,
    keep: int = 2,
    protected: tuple[int, ...] = (),
) -> Path:
    """Write step `step`'s checkpoint; then remove all but the newest `keep` and the `protected` steps."""
    from tasks.storage import publish_dir

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(".step-*"):  # a write killed before its rename (one trainer writes here)
        shutil.rmtree(stale, ignore_errors=True)
    final = directory / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}.", dir=directory))
    try:
        getattr(model, "module", model).save_pretrained(tmp, safe_serialization=True)
        chat.tokenizer.save_pretrained(tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        # RNG states as a tensor and JSON: every file a resume reads loads with weights_only=True (no unpickling
        # of arbitrary objects from a checkpoint directory)
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        (tmp / "rng.json").write_text(json.dumps(rng_to_json()))
        (tmp / "state.json").write_text(json.dumps({"step": step, **(extra or {})}))
        publish_dir(tmp, final)  # fsynced, and exchanged with an existing step: never a moment without one
    except BaseException:  # a full disk: the earlier checkpoints stay the newest complete ones
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    keep_names = {f"step-{s:06d}" for s in protected}
    for old in sorted(directory.glob("step-*"))[:-keep]:
        if old.name not in keep_names:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = sorted(p for p in Path(directory).glob("step-*") if (p / "state.json").exists())
    return found[-1] if found else None


def restore_weights(path: str | Path, model: torch.nn.Module) -> None:
    """Load a checkpoint's weights (or, with grpo.lora, its adapter) into `model` in place."""
    from safetensors.torch import load_file

    path = Path(path)
    if (path / "adapter_model.safetensors").exists():  # grpo.lora: peft saved only the adapter
        from tasks.policy.lora import restore_adapter

        restore_adapter(model, path)
    else:
        getattr(model, "module", model).load_state_dict(load_file(path / "model.safetensors"))


def restore_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load weights, optimizer and RNG states in place; returns the saved state (with `step`)."""
    path = Path(path)
    restore_weights(path, model)
    if not (path / "rng.json").exists():
        raise ValueError(
            f"checkpoint {path} predates rng.json (its RNG state is pickled, which resume no longer "
            "unpickles): remove its checkpoints directory to train from the start"
        )
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    torch.set_rng_state(torch.load(path / "rng.pt", weights_only=True)["torch"])
    rng_from_json(json.loads((path / "rng.json").read_text()))
    return json.loads((path / "state.json").read_text())


def rng_to_json() -> dict:
    """Python's and numpy's global RNG states as JSON (lists of ints), exactly restorable."""
    version, internal, gauss = random.getstate()
    # the legacy global generator is MT19937: its state is the tuple form, never the dict
    kind, keys, pos, has_gauss, cached = cast(tuple[str, Any, int, int, float], np.random.get_state())
    return {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def rng_from_json(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
