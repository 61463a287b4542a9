"""Multi-turn rollouts with tools (issue 31, parts 1-2): docs/multiturn.md.

* :mod:`.calculator`: the safe arithmetic of the ``calc`` tool (an AST walk, no eval)
* :mod:`.tools`: the tool registry and the ``<tool>name(arg)</tool>`` syntax
* :mod:`.base`: the environment interface (reset / step) and the environments built in
* :mod:`.runner`: environment calls with a timeout and bounded concurrency
* :mod:`.rollout`: the multi-turn rollout, token in, token out, with its loss mask
* :mod:`.chat`: the chat template per turn (the prompt rendered, observations wrapped)
* :mod:`.tool_task`, :mod:`.transcripts`, :mod:`.answers`: the built-in tool task
"""
