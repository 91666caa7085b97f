"""A model taught one tool call: the embedded default's architecture, small, fine-tuned on one desk
demonstration until greedy decoding repeats it. A deterministic caller for serving tests (nothing
downloaded; a few seconds of SFT)."""

from __future__ import annotations

import random
from pathlib import Path


def taught_model(directory: str | Path, steps: int = 150):
    """(saved model directory, the task it was taught, the call it makes)."""
    import torch

    from tasks.config import ModelSettings
    from tasks.envs import new_episode
    from tasks.envs.desk import demonstration, toolset_tasks
    from tasks.envs.toolset import load_toolset
    from tasks.policy.model import build_model, save_model
    from tasks.policy.sft import demonstration_backward

    task = toolset_tasks("1", 1, 5)[0]
    call, answer = demonstration(task, random.Random(0))
    model, chat = build_model(ModelSettings(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128))
    ep = new_episode(task, chat)
    ep.add_message(call)
    sample = [(ep.token_ids, ep.loss_mask)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        demonstration_backward(model, sample, chat.pad_id)
        opt.step()
    model.eval()
    return save_model(model, chat, directory, toolset=load_toolset("1")), task, call["tool_calls"][0]["function"]
