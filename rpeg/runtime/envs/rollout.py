"""Multi-turn rollouts, token in, token out.

One sample alternates model turns and environment steps up to ``task.multiturn.max_turns``:

    prompt ids | turn 1 ids (generated) | observation 1 ids | turn 2 ids | ... | EOS

Every later turn is generated from the ids so far, as ids: the model's tokens are never
decoded and re-encoded (text goes to the environment only to read). A turn ends at EOS (the
final answer), at the first occurrence of the ids of ``</tool>`` (a tool call: the ids
after it are dropped, like a stop string), or at ``task.multiturn.max_turn_tokens``. The
observation's text is tokenized (no special tokens) and appended; with a chat template
(:mod:`rpeg.runtime.envs.chat`) the prompt is rendered by it and each observation is wrapped
as a tool (or user) message, the wrapper's ids taken from the template. The whole response
is capped at ``workload.max_response_tokens`` and by the model's context.

The batch: ``response_ids`` the transcript after the prompt; ``response_attention`` 1 on all
of it; ``response_mask`` (the loss mask) 1 only on generated tokens; ``sample_logprobs`` the
engine's log-probs on generated tokens, 0 on observation tokens.

Environment calls (reset and step) go through :class:`~rpeg.runtime.envs.runner.EnvRunner`
(``env_timeout_s`` each, ``env_concurrency`` at once): a hang, an exception or a non-text
result ends that sample as an error sample (counted in ``env_error/<reason>``), never the
step.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rpeg.runtime.actors.fault_points import env_turn
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.data import Example
from rpeg.runtime.engines.base import SamplingParams
from rpeg.runtime.engines.row_sampling import turn_seed
from rpeg.runtime.engines.torch_engine import left_pad
from rpeg.runtime.envs.base import EnvStep, make_env
from rpeg.runtime.envs.chat import ChatTurns
from rpeg.runtime.envs.runner import EnvOutcome, EnvRunner
from rpeg.runtime.envs.tools import TOOL_CLOSE

Metrics = dict[str, float]

#: why a sample ended other than by its final answer (counted: ``mt_end/<reason>``)
END_TURN_TOKENS, END_MAX_TURNS, END_SAMPLE_TOKENS = "turn_tokens", "max_turns", "sample_tokens"


@dataclass
class _Row:
    """One sample's transcript under construction."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss: list[int] = field(default_factory=list)
    done: bool = False
    finished: bool = False  # ended by EOS
    turns: int = 0
    decoded: int = 0  # tokens the engine generated in its turns (a tool call's tail too)
    obs_tokens: int = 0  # observation (and chat wrapper) ids appended
    tool_calls: int = 0
    env_reward: float = 0.0
    error: str = ""  # an environment failure (env_timeout / env_error / env_bad_result)
    end: str = ""  # a cap that ended it
    messages: list[dict[str, str]] = field(default_factory=list)  # chat: the prompt's
    observations: list[str] = field(default_factory=list)  # the observations appended
    parts: list[str] = field(default_factory=list)  # chat: turn texts and observations

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.ids += list(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.loss += [1 if logprobs is not None else 0] * len(ids)


_RUNNERS: dict[tuple[float, int], EnvRunner] = {}


def env_runner(timeout_s: float, concurrency: int) -> EnvRunner:
    """One runner per limit pair in a process, so its concurrency bound holds across steps
    (a hung call keeps its slot)."""
    key = (float(timeout_s), int(concurrency))
    if key not in _RUNNERS:
        _RUNNERS[key] = EnvRunner(timeout_s, concurrency)
    return _RUNNERS[key]


def find_subsequence(ids: Sequence[int], pattern: Sequence[int]) -> int | None:
    """The index just past the first occurrence of ``pattern`` in ``ids`` (None: absent)."""
    n = len(pattern)
    if not n:
        return None
    for i in range(len(ids) - n + 1):
        if list(ids[i : i + n]) == list(pattern):
            return i + n
    return None


def _reset_step(env, ex: Example) -> EnvStep:
    return EnvStep(env.reset(ex), 0.0, False)


def multiturn_rollout(
    worker: Any,
    examples: Sequence[Example],
    samples_per_prompt: int,
    multiturn: Any,
    *,
    prompt_template: str = "{question}",
    params: SamplingParams | None = None,
    seed: int | None = None,
    first_row: int = 0,
    runner: EnvRunner | None = None,
) -> tuple[RolloutBatch, Metrics]:
    """``samples_per_prompt`` multi-turn samples per example (groups contiguous) with the
    worker's engine; ``multiturn``: a ``task.multiturn`` section. ``seed``: the first row's
    seed (``rollout_seed(run seed, step, first_row)``); row ``i`` is the step's row
    ``first_row + i`` and samples turn ``t`` at ``turn_seed(seed + i, t)`` whatever rows share
    the turn's batch, so a rollout split into other chunks samples the same transcripts."""
    t0 = time.perf_counter()
    mt = multiturn
    tok = worker.tokenizer
    params = params or worker.sampling_params()
    runner = runner or env_runner(mt.env_timeout_s, mt.env_concurrency)
    sample_cap = params.max_new_tokens
    ctx = getattr(getattr(worker.lm, "config", None), "max_position_embeddings", None) or 10**9
    stop_ids = tok(TOOL_CLOSE, add_special_tokens=False)["input_ids"]
    chat = ChatTurns.of(mt, tok)
    if chat is not None:
        chat.probe(tok)  # a template that cannot wrap observations: a named error, now
    rep = [ex for ex in examples for _ in range(samples_per_prompt)]
    tasks = rep  # what reset sees; with a chat template its answer is the last user message
    if chat is not None:
        tasks = [dataclasses.replace(ex, rendered="", messages=(), system_prompt="") for ex in rep]
    envs = [make_env(mt.env, mt.tools, prompt_template, mt.env_timeout_s) for _ in rep]
    m: Metrics = {}
    te = time.perf_counter()
    firsts = runner.run_all(
        [functools.partial(_reset_step, e, ex) for e, ex in zip(envs, tasks, strict=True)]
    )
    env_s = time.perf_counter() - te
    texts = [
        o.step.observation if o.step else ex.prompt(prompt_template)
        for o, ex in zip(firsts, tasks, strict=True)
    ]
    msgs: list[list[dict[str, str]]] = [[] for _ in rep]
    if chat is not None:  # the example's system prompt and earlier messages, then the text
        msgs = [chat.prompt_messages(ex, t) for ex, t in zip(rep, texts, strict=True)]
        texts = [chat.prompt_text(tok, mm) for mm in msgs]
    rows = [_Row(p, messages=mm) for p, mm in zip(worker.encode_prompts(texts), msgs, strict=True)]
    for r, o in zip(rows, firsts, strict=True):
        if o.error:
            r.done, r.error = True, o.error
            r.add([tok.eos_token_id], None)  # an empty transcript: nothing to train on
    gen_s, gen_tokens = 0.0, 0
    for t in range(mt.max_turns):
        active = [i for i, r in enumerate(rows) if not r.done]
        caps = []
        for i in list(active):
            r = rows[i]
            cap = min(mt.max_turn_tokens, sample_cap - len(r.ids), ctx - len(r.prompt) - len(r.ids))
            if cap <= 0:
                r.done, r.end = True, END_SAMPLE_TOKENS
                active.remove(i)
            else:
                caps.append(cap)
        if not active:
            break
        tg = time.perf_counter()
        out = worker.generate(
            [rows[i].prompt + rows[i].ids for i in active],
            params,
            seed=None if seed is None else [turn_seed(seed + i, t) for i in active],
            max_new_tokens=caps,
        )
        gen_s += time.perf_counter() - tg
        acting: list[tuple[int, str, bool]] = []  # (row, action text, ended by EOS)
        for j, i in enumerate(active):
            r = rows[i]
            n = int(out.lengths[j])
            ids = out.response_ids[j, :n].tolist()
            lps = out.logprobs[j, :n].tolist()
            gen_tokens += n
            r.decoded += n
            cut = find_subsequence(ids, stop_ids)
            if cut is not None:  # a tool call: what follows its close is dropped
                ids, lps = ids[:cut], lps[:cut]
            r.add(ids, lps)
            r.turns += 1
            if chat is not None:
                r.parts.append(tok.decode(ids, skip_special_tokens=True))
            eos = cut is None and bool(out.finished[j])
            if cut is None and not eos:  # the turn ran out of tokens
                r.done, r.end = True, END_TURN_TOKENS
                continue
            r.finished = eos
            acting.append((i, tok.decode(ids, skip_special_tokens=True), eos))
        env_turn(t + 1)  # a fault point for recovery tests (off unless RPEG_FAULT_AT is set)
        te = time.perf_counter()
        outcomes = runner.run_all([functools.partial(envs[i].step, text) for i, text, _ in acting])
        env_s += time.perf_counter() - te
        for (i, _, eos), o in zip(acting, outcomes, strict=True):
            last = t == mt.max_turns - 1
            _apply(rows[i], o, eos, tok, chat, last_turn=last, sample_cap=sample_cap)
    for r in rows:
        if not r.done:
            r.done, r.end = True, END_MAX_TURNS
    batch = _batch(worker, examples, samples_per_prompt, texts, rows, params, first_row, chat)
    m.update(_metrics(rows, gen_s, gen_tokens, env_s))
    m["generate_s"] = time.perf_counter() - t0
    return batch, m


def _apply(
    r: _Row,
    o: EnvOutcome,
    eos: bool,
    tok,
    chat: ChatTurns | None,
    *,
    last_turn: bool,
    sample_cap: int,
) -> None:
    """One environment outcome into its row: an error, the end, or the observation (with a
    chat template: wrapped as a message, the wrapper's ids from the template)."""
    if o.error:
        r.done, r.error = True, o.error
        return
    st = o.step
    r.tool_calls += int(st.tool_called)
    if st.done or eos:
        r.done, r.env_reward = True, st.reward
        return
    if last_turn:
        r.done, r.end = True, END_MAX_TURNS
        return
    if chat is None:
        obs = tok(st.observation, add_special_tokens=False)["input_ids"]
    else:
        obs = chat.wrapper_ids(tok, r.messages, r.observations, st.observation)
    if len(r.ids) + len(obs) >= sample_cap:  # no room for the observation and a turn
        r.done, r.end = True, END_SAMPLE_TOKENS
        return
    r.add(obs, None)
    r.obs_tokens += len(obs)
    r.observations.append(st.observation)
    r.parts.append(st.observation)


def _batch(worker, examples, k, prompts, rows: list[_Row], params, first_row, chat):
    tok = worker.tokenizer
    if chat is None:
        responses = tok.batch_decode([r.ids for r in rows], skip_special_tokens=True)
    else:  # the model's text and the observations, not the template's headers
        responses = ["".join(r.parts) for r in rows]
    p_ids, p_mask = left_pad([r.prompt for r in rows], tok.pad_token_id)
    width = max(len(r.ids) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), tok.pad_token_id, dtype=torch.long)
    loss = torch.zeros((b, width), dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    lp = torch.zeros((b, width), dtype=torch.float32)
    for i, r in enumerate(rows):
        n = len(r.ids)
        ids[i, :n] = torch.as_tensor(r.ids, dtype=torch.long)
        loss[i, :n] = torch.as_tensor(r.loss, dtype=torch.long)
        lp[i, :n] = torch.as_tensor(r.logprobs, dtype=torch.float32)
        attn[i, :n] = 1
    version = int(getattr(worker.engine, "policy_version", getattr(worker, "policy_version", 0)))
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=ids,
        response_mask=loss,
        sample_logprobs=lp,
        policy_version=torch.full((b,), version, dtype=torch.long),
        group_ids=torch.arange(len(examples)).repeat_interleave(k),
        prompts=list(prompts),
        responses=responses,
        reference_answers=[ex.answer for ex in examples for _ in range(k)],
        data_sources=[ex.data_source for ex in examples for _ in range(k)],
        sample_index=first_row + torch.arange(b, dtype=torch.long),
        temperature=params.temperature if params.temperature > 0 else 1.0,
        response_attention=attn,
    )


def _metrics(rows: list[_Row], gen_s: float, gen_tokens: int, env_s: float) -> Metrics:
    b = max(len(rows), 1)
    lengths = [len(r.ids) for r in rows]
    m: Metrics = {
        "gen_tokens_per_s": gen_tokens / max(gen_s, 1e-9),
        "env_s": env_s,
        "response_length": sum(lengths) / b,
        "response_length_max": float(max(lengths, default=0)),
        "truncated_frac": sum(not r.finished for r in rows) / b,
        "tool_use_rate": sum(r.tool_calls > 0 for r in rows) / b,
        "tool_calls_mean": sum(r.tool_calls for r in rows) / b,
        "turns_mean": sum(r.turns for r in rows) / b,
        "env_reward_mean": sum(r.env_reward for r in rows) / b,
        "env_errors": float(sum(bool(r.error) for r in rows)),
    }
    turns, obs = sum(r.turns for r in rows), sum(len(r.observations) for r in rows)
    if turns:  # the turn shape `rpeg calibrate` fits (rpeg.perf.calibration.turn_fit)
        m["turn_tokens_mean"] = sum(r.decoded for r in rows) / turns
    if obs:
        m["observation_tokens_mean"] = sum(r.obs_tokens for r in rows) / obs
    for r in rows:
        if r.error:
            m[f"env_error/{r.error}"] = m.get(f"env_error/{r.error}", 0.0) + 1
        if r.end:
            m[f"mt_end/{r.end}"] = m.get(f"mt_end/{r.end}", 0.0) + 1
    return m


def run_multiturn(
    ctx: Any, examples: Sequence[Example], *, seed: int | None, first_row: int = 0
) -> tuple[RolloutBatch, Metrics]:
    """The ``generate`` stage of a multi-turn task (``task.multiturn.env`` set) over a
    :class:`rpeg.runtime.stages.StageContext`: what ``run_stage`` calls in its place."""
    c = ctx.config
    return multiturn_rollout(
        ctx.actor,
        examples,
        c.workload.samples_per_prompt,
        c.task.multiturn,
        prompt_template=c.task.prompt_template,
        seed=seed,
        first_row=first_row,
    )
