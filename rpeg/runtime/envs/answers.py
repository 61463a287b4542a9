"""The final answer of a multi-turn transcript, and the reward rule over it.

The final answer is the text after the last observation (``</result>`` or ``</error>``);
without any observation, the whole text. Registered as the reward ``tool_final_answer``
(name it in ``task.rewards``; ``rpeg.runtime.envs.answers`` in ``task.reward_modules``)."""

from __future__ import annotations

from rpeg.runtime.envs.tools import ERROR_CLOSE, RESULT_CLOSE
from rpeg.runtime.rewards import exact_numeric, register_reward

REWARD_NAME = "tool_final_answer"


def final_answer(text: str) -> str:
    cut = 0
    for tag in (RESULT_CLOSE, ERROR_CLOSE):
        i = text.rfind(tag)
        if i >= 0:
            cut = max(cut, i + len(tag))
    return text[cut:].strip()


def final_answer_reward(prompt: str, response: str, reference_answer: str) -> float:
    """1.0 when the final answer is exactly the reference number, else 0.0."""
    return exact_numeric(prompt, final_answer(response), reference_answer)


register_reward(REWARD_NAME, final_answer_reward, overwrite=True)
