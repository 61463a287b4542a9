"""The chat template applied per turn (rpeg.runtime.envs.chat), token in, token out.

A tiny Hugging Face tokenizer built here (no download): the char vocabulary
(tests/multiturn/scripted.ch: id = ord(c) - 27, newline 4, BOS 1) plus two special tokens,
``<|im_start|>`` = 100 and ``<|im_end|>`` = 101 (also EOS), and a ChatML-style template.
Expected ids are worked by hand from that template."""

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime.data import Example
from rpeg.runtime.envs.chat import ChatTemplateError, ChatTurns
from rpeg.runtime.envs.rollout import multiturn_rollout
from rpeg.runtime.tokenizer import build_char_tokenizer

from .scripted import BOS, ScriptedWorker, ch, multiturn

S, E = 100, 101  # <|im_start|>, <|im_end|>
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CALL = ch("<tool>calc(12*7)</tool>")  # 23 ids
RESULT = "<result>84</result>"


def chat_tokenizer(template: str = CHATML):
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = template
    return tok


class ChatWorker(ScriptedWorker):
    """The scripted worker with a real tokenizer's prompt encoding (BOS in front)."""

    def __init__(self, turns, tok, **kw):
        super().__init__(turns, **kw)
        self.tokenizer = tok

    def encode_prompts(self, texts):
        return [self.tokenizer(t)["input_ids"] for t in texts]


def header(role: str) -> list[int]:
    return [S, *ch(f"{role}\n")]


def wrapper(obs: str, role: str = "tool") -> list[int]:
    """End of the assistant turn, the observation's message, the next assistant header."""
    return [E, *ch("\n"), *header(role), *ch(obs), E, *ch("\n"), *header("assistant")]


PROMPT = [BOS, *header("user"), *ch("12x7?"), E, *ch("\n"), *header("assistant")]  # 25 ids


def _rollout(**kw):
    w = ChatWorker(
        [
            # call 1: row 0 calls the tool (then "zz", dropped); row 1 writes the 10 characters
            # of "<|im_end|>" one by one, then 85 and the real <|im_end|> (EOS)
            [(CALL + ch("zz"), -0.25, False), ([*ch("<|im_end|>85"), E], -0.75, True)],
            # call 2 (row 0 only): a BOS the text would lose, then 84 and EOS
            [([BOS, *ch("84"), E], -0.5, True)],
        ],
        chat_tokenizer(kw.pop("template", CHATML)),
    )
    batch, m = multiturn_rollout(w, [Example("12x7?", "84")], 2, multiturn(**kw), seed=5)
    return w, batch, m


def test_prompt_turns_and_wrapper_ids_laid_out_as_the_template_renders():
    w, batch, m = _rollout()
    wrap = wrapper(RESULT)  # 1 + 1 + 6 + 19 + 1 + 1 + 11 = 40 ids
    assert len(wrap) == 40
    want0 = CALL + wrap + [BOS, *ch("84"), E]  # 23 + 40 + 4 = 67
    want1 = [*ch("<|im_end|>85"), E]  # 13 ids: the model's, not re-encoded to [E, 8, 5, E]
    assert batch.prompt_ids.tolist() == [PROMPT, PROMPT]
    assert batch.prompts[0] == "<|im_start|>user\n12x7?<|im_end|>\n<|im_start|>assistant\n"
    assert batch.response_ids[0].tolist() == want0
    assert batch.response_ids[1, :13].tolist() == want1
    assert batch.response_mask[0].tolist() == [1] * 23 + [0] * 40 + [1] * 4
    assert batch.response_mask[1].tolist() == [1] * 13 + [0] * 54
    assert batch.response_attention[1].tolist() == [1] * 13 + [0] * 54
    assert batch.sample_logprobs[0].tolist() == [-0.25] * 23 + [0.0] * 40 + [-0.5] * 4
    # the second turn was generated from ids: prompt + turn 1 + wrapper; the cap is
    # min(28, 64 - 63) = 1 token
    assert w.calls[1] == ([PROMPT + CALL + wrap], [1])
    # ... which is what the template renders for the same conversation, tokenized
    tok = w.tokenizer
    conv = [
        {"role": "user", "content": "12x7?"},
        {"role": "assistant", "content": "<tool>calc(12*7)</tool>"},
        {"role": "tool", "content": RESULT},
    ]
    rendered = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert tok(rendered)["input_ids"] == PROMPT + CALL + wrap
    # the response text: the model's text and the observation, no template headers
    assert batch.responses == [f"<tool>calc(12*7)</tool>{RESULT}84", "<|im_end|>85"]
    assert m["tool_use_rate"] == 0.5 and m["env_reward_mean"] == 0.5


def test_observation_as_a_user_message():
    _, batch, _ = _rollout(observation_role="user")
    assert batch.response_ids[0, 23:63].tolist() == wrapper(RESULT, role="user")


def test_chat_template_none_keeps_plain_text():
    _, batch, _ = _rollout(chat_template="none")
    assert batch.prompt_ids[0].tolist() == [BOS, *ch("12x7?")]
    assert batch.response_ids[0].tolist() == CALL + ch(RESULT) + [BOS, *ch("84"), E]


def test_wrapper_sees_the_history():
    """A template that numbers tool results: the second wrapper says #2."""
    numbered = (
        "{% set n = namespace(k=0) %}{% for m in messages %}"
        "{% if m.role == 'tool' %}{% set n.k = n.k + 1 %}<|im_start|>tool#{{ n.k }}\n"
        "{% else %}<|im_start|>{{ m.role }}\n{% endif %}{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    turns = ChatTurns(numbered)
    tok = chat_tokenizer(numbered)
    prompt = turns.prompt_messages(Example("q", ""), "q")
    assert turns.wrapper_ids(tok, prompt, [], "a") == wrapper("a", role="tool#1")
    assert turns.wrapper_ids(tok, prompt, ["a"], "b") == wrapper("b", role="tool#2")


def test_system_prompt_and_chat_messages_come_first():
    turns = ChatTurns(CHATML)
    ex = Example("12x7?", "84", system_prompt="Be brief.")
    assert turns.prompt_messages(ex, "12x7?") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "12x7?"},
    ]


def test_a_template_without_a_tool_role_is_a_named_error_before_the_first_turn():
    no_tool = CHATML.replace(
        "{% for m in messages %}",
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool') }}"
        "{% endif %}",
    )
    with pytest.raises(ChatTemplateError) as exc:
        _rollout(template=no_tool)
    msg = str(exc.value)
    assert "task.multiturn.chat_template" in msg and "observation_role: user" in msg
    _, batch, _ = _rollout(template=no_tool, observation_role="user")  # the way out works
    assert batch.response_ids[0, 23:63].tolist() == wrapper(RESULT, role="user")


def test_a_template_that_hides_a_turn_is_a_named_error():
    """Assistant turns rendered as "..." once a later message follows: the wrapper cannot be
    told from the turn's content."""
    hides = CHATML.replace(
        "{{ m.content }}",
        "{% if m.role == 'assistant' and not loop.last %}...{% else %}{{ m.content }}{% endif %}",
    )
    with pytest.raises(
        ChatTemplateError, match="does not show an assistant message's content"
    ) as exc:
        ChatTurns(hides).probe(chat_tokenizer(hides))
    assert "task.multiturn.chat_template: none" in str(exc.value)


def test_a_template_that_drops_earlier_reasoning_is_warned_about_and_wraps():
    """A Qwen3-style template: the last assistant message gets an (empty) reasoning block,
    earlier ones not -- the text before the latest turn changes once a tool message follows.
    The wrapper after the turn is still the template's; a warning says the rest differs."""
    think = CHATML.replace(
        "{{ m.content }}",
        "{% if m.role == 'assistant' and loop.last %}<think></think>{% endif %}{{ m.content }}",
    )
    turns, tok = ChatTurns(think), chat_tokenizer(think)
    prompt = turns.prompt_messages(Example("q", ""), "q")
    with pytest.warns(UserWarning, match="renders earlier turns differently"):
        assert turns.wrapper_ids(tok, prompt, [], RESULT) == wrapper(RESULT)


def test_auto_without_a_template_is_plain_text():
    assert ChatTurns.of(multiturn(), build_char_tokenizer()) is None
    assert ChatTurns.of(multiturn(), chat_tokenizer()) == ChatTurns(CHATML, "tool")


@pytest.mark.parametrize(
    "task,field",
    [
        ({"multiturn": {"env": "tools", "chat_template": "yes"}}, "task.multiturn.chat_template"),
        ({"multiturn": {"env": "tools", "observation_role": "system"}}, "observation_role"),
        ({"chat_template": "none", "multiturn": {"env": "tools"}}, "multiturn.chat_template"),
    ],
)
def test_bad_values_name_the_field(task, field):
    with pytest.raises(ConfigError) as exc:
        RunConfig.from_dict({"task": task})
    assert field in str(exc.value)


def test_both_none_is_accepted():
    c = RunConfig.from_dict(
        {"task": {"chat_template": "none", "multiturn": {"env": "tools", "chat_template": "none"}}}
    )
    assert c.task.multiturn.chat_template == "none"


def test_tool_task_warmup_rows_have_the_rollouts_layout():
    """tool_arithmetic's warm-up under the same template: prompt | call | wrapper | answer |
    EOS, trained on the call, the answer and EOS -- the layout of the rollout above."""
    from rpeg.runtime.envs.tool_task import ToolArithmeticSource

    src = ToolArithmeticSource(tool_share=1.0, chat_template="auto")
    ex = Example("12x7?", "84", solution="12*7")
    ids, mask, loss = src.sft_batch(chat_tokenizer(), [ex], "{question}")
    want = PROMPT + CALL + wrapper(RESULT) + ch("84") + [E]  # 25 + 23 + 40 + 3 = 91
    assert ids[0].tolist() == want
    assert loss[0].tolist() == [0] * 25 + [1] * 23 + [0] * 40 + [1] * 3
    assert mask[0].tolist() == [1] * 91
    plain = ToolArithmeticSource(tool_share=1.0, chat_template="none")
    ids, _, _ = plain.sft_batch(chat_tokenizer(), [ex], "{question}")
    assert ids[0].tolist() == [BOS, *ch("12x7?"), *CALL, *ch(RESULT), *ch("84"), E]
