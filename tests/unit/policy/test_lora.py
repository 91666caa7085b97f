"""LoRA helpers (tasks/policy/lora.py) and the grpo.lora settings: the adapter starts as the identity, its
state round-trips through a checkpoint directory, the reference is the base, bad settings are refused."""

import json

import pytest
import torch

from tasks.config import LoraSettings, ModelSettings, SettingsError, load_settings
from tasks.policy import lora
from tasks.policy.model import build_model, save_model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model, chat = build_model(ModelSettings())
    directory = save_model(model, chat, tmp_path_factory.mktemp("lora") / "base")
    return model, chat, directory


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def _perturb(peft_model, seed):
    gen = torch.Generator().manual_seed(seed)
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn(p.shape, generator=gen) * 0.3


def test_engine_rank_is_the_next_vllm_rank():
    assert [lora.engine_rank(r) for r in (1, 2, 8, 9, 64)] == [1, 8, 8, 16, 64]
    with pytest.raises(ValueError, match="grpo.lora.rank"):
        lora.engine_rank(513)


def test_a_fresh_adapter_is_the_identity_and_the_reference_is_the_base(base):
    model, _, directory = base
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(directory)
    ids = [1, 5, 6, 7, 8, 9]
    wrapped = lora.wrap(AutoModelForCausalLM.from_pretrained(directory), LoraSettings(rank=4))
    assert torch.equal(_logits(wrapped, ids), _logits(plain, ids))
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    _perturb(wrapped, 0)
    assert not torch.allclose(_logits(wrapped, ids), _logits(plain, ids))
    assert torch.equal(_logits(lora.BaseOf(wrapped), ids), _logits(plain, ids))


def test_adapter_state_round_trips_and_merges_to_the_same_model(base, tmp_path):
    _, _, directory = base
    from transformers import AutoModelForCausalLM

    wrapped = lora.wrap(AutoModelForCausalLM.from_pretrained(directory), LoraSettings(rank=8, alpha=16))
    _perturb(wrapped, 1)
    adapter = lora.adapter_state(wrapped)
    full = sum(p.numel() * p.element_size() for p in AutoModelForCausalLM.from_pretrained(directory).parameters())
    assert 0 < lora.adapter_bytes(adapter) < full / 4
    saved = lora.save_adapter(wrapped, tmp_path / "adapter", directory)
    config = json.loads((saved / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["base_model_name_or_path"] == str(directory)
    assert json.loads((saved / lora.BASE_FILE).read_text())["manifest_sha256"]
    other = lora.wrap(AutoModelForCausalLM.from_pretrained(directory), LoraSettings(rank=8, alpha=16))
    lora.restore_adapter(other, saved)
    ids = [1, 9, 8, 7, 6]
    assert torch.equal(_logits(other, ids), _logits(wrapped, ids))
    merged = other.merge_and_unload()
    assert torch.allclose(_logits(merged, ids), _logits(wrapped, ids), atol=1e-5)


def test_unknown_target_module_is_refused(base):
    model, _, _ = base
    with pytest.raises(ValueError, match="grpo.lora.target_modules.*qkv"):
        lora.wrap(model, LoraSettings(target_modules=["qkv"]))


def test_lora_settings(tmp_path):
    s = load_settings(overrides={"grpo": {"lora": {"rank": "16"}}}, environ={})
    assert s.grpo.lora.rank == 16 and s.grpo.lora.target_modules[0] == "q_proj"
    assert s.rollout.collective_sync and not s.collective_sync  # adapters go by the object store
    assert load_settings(environ={}).grpo.lora is None
    with pytest.raises(SettingsError, match="rollout.backend=vllm"):
        load_settings(overrides={"grpo": {"lora": {}}, "rollout": {"backend": "hf"}}, environ={})
    with pytest.raises(SettingsError, match="grpo.lora.rank"):
        load_settings(overrides={"grpo": {"lora": {"rank": 0}}}, environ={})
