"""The environment interface of multi-turn rollouts, and the environments built in.

An environment holds one sample's episode::

    first_observation = env.reset(task)        # the prompt text
    step = env.step(action_text)               # -> EnvStep(observation, reward, done)

``action_text`` is the text of the model's turn (decoded for the environment to read; the
sample itself keeps the generated token ids). ``observation`` is new text the rollout
tokenizes and appends after the turn (never trained on). ``done`` ends the episode;
``reward`` is the environment's score of it (reported as ``env_reward_mean``; the step's
reward is the task's reward rules over the whole transcript, like a single-turn response).

:data:`ENVIRONMENTS` maps the names ``task.multiturn.env`` accepts to factories.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rpeg.runtime.data import Example
from rpeg.runtime.envs.answers import final_answer_reward
from rpeg.runtime.envs.calculator import CalcError
from rpeg.runtime.envs.tool_sandbox import TOOL_TIMEOUT_S, tool_pool
from rpeg.runtime.envs.tools import (
    ERROR_CLOSE,
    ERROR_OPEN,
    RESULT_CLOSE,
    RESULT_OPEN,
    TOOLS,
    Tool,
    parse_tool_call,
)


@dataclass(frozen=True)
class EnvStep:
    """What one environment step returns. ``tool_called``: the turn called a tool."""

    observation: str
    reward: float
    done: bool
    tool_called: bool = False


class Environment(Protocol):
    def reset(self, task: Example) -> str: ...

    def step(self, action: str) -> EnvStep: ...


class BadToolResult(TypeError):
    """A tool returned something that is not text (an error sample: ``env_bad_result``)."""


class ToolEnv:
    """Answers tool calls; a turn without one is the final answer.

    A turn holding ``<tool>name(arg)</tool>`` gets ``<result>value</result>`` (or
    ``<error>why</error>`` for an unknown tool or an argument the tool refuses, e.g. a
    calculator expression it does not allow) and the episode goes on. A turn without a call
    ends it with the final-answer reward (1 when the number after the last observation is
    the reference answer). A tool that raises anything else, or returns non-text, raises out
    of :meth:`step`: the rollout makes that sample an error sample.

    A built-in tool (one of :data:`TOOLS` defined in ``rpeg.runtime.envs``) runs in a child
    process killed after ``timeout_s`` (:mod:`rpeg.runtime.envs.tool_sandbox`): no answer in
    time is a ``ToolTimeout`` (an ``env_timeout`` sample). Another function (a caller's own
    ``registry``) runs inline, under the rollout's thread timeout only."""

    def __init__(
        self,
        tools: Sequence[str],
        *,
        template: str = "{question}",
        registry: dict[str, Tool] | None = None,
        timeout_s: float = TOOL_TIMEOUT_S,
    ):
        reg = TOOLS if registry is None else registry
        self.tools = {n: reg[n] for n in tools}
        self.template = template
        self.answer = ""
        self.timeout_s = timeout_s
        if any(self._sandboxed(t) for t in self.tools.values()):
            tool_pool().warm()

    @staticmethod
    def _sandboxed(tool: Tool) -> bool:
        builtin = getattr(tool.fn, "__module__", "") or ""
        return TOOLS.get(tool.name) is tool and builtin.startswith("rpeg.runtime.envs.")

    def _run(self, tool: Tool, argument: str) -> object:
        if not self._sandboxed(tool):
            return tool.fn(argument)
        got = tool_pool().call(tool.name, argument, self.timeout_s)
        if "refused" in got:
            raise CalcError(got["refused"])
        if "error" in got:
            raise RuntimeError(f"tool {tool.name!r}: {got['error']}")
        return got["result"]

    def reset(self, task: Example) -> str:
        self.answer = task.answer
        return task.prompt(self.template)

    def step(self, action: str) -> EnvStep:
        call = parse_tool_call(action)
        if call is None:
            return EnvStep("", final_answer_reward("", action, self.answer), True)
        tool = self.tools.get(call.name)
        if tool is None:
            allowed = ", ".join(sorted(self.tools))
            return EnvStep(
                f"{ERROR_OPEN}unknown tool; use {allowed}{ERROR_CLOSE}", 0.0, False, True
            )
        try:
            result = self._run(tool, call.argument)
        except CalcError as exc:  # the tool refuses the argument: the model reads why
            return EnvStep(f"{ERROR_OPEN}{exc}{ERROR_CLOSE}", 0.0, False, True)
        if not isinstance(result, str):
            raise BadToolResult(f"tool {call.name!r} returned {type(result).__name__}, not text")
        return EnvStep(f"{RESULT_OPEN}{result}{RESULT_CLOSE}", 0.0, False, True)


#: environment name -> factory(tools, template)
ENVIRONMENTS: dict[str, Callable[..., Environment]] = {
    "tools": lambda tools, template: ToolEnv(tools, template=template),
}


def environment_names() -> list[str]:
    return sorted(ENVIRONMENTS)


def make_env(
    name: str, tools: Sequence[str], template: str, timeout_s: float | None = None
) -> Environment:
    """The environment ``name``; ``timeout_s`` (the rollout's ``env_timeout_s``) bounds the
    tool calls of a :class:`ToolEnv`."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; allowed: {', '.join(environment_names())}")
    env = ENVIRONMENTS[name](tools, template)
    if timeout_s is not None and isinstance(env, ToolEnv):
        env.timeout_s = timeout_s
    return env
