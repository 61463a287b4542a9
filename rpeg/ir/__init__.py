"""RPEG IR: the graph of one RL step (stages, data edges, cross-step state edges).

Pure Python: imports no torch, dask or prefect. See docs/ir.md.
"""

from rpeg.ir.builders import (
    BUILDERS,
    build,
    builder_names,
    dapo,
    dr_grpo,
    grpo,
    ppo,
    reinforce_pp,
    rloo,
)
from rpeg.ir.checks import problems, validate
from rpeg.ir.graph import (
    DEFAULT_INPUTS,
    FIELDS,
    KIND_ROLES,
    WEIGHTS_STATE,
    Edge,
    ExecutionUnit,
    FusedGroup,
    Granularity,
    Graph,
    GraphError,
    Params,
    Role,
    Stage,
    StageKind,
    StateEdge,
)
from rpeg.ir.recipes import RECIPE_NAMES, RECIPES, Recipe, recipe
from rpeg.ir.serialize import from_dict, from_yaml, to_dict, to_yaml
from rpeg.ir.transforms import bound_async, colocate, fuse, separate, share_actor_critic, unfuse
from rpeg.ir.visual import has_graphviz, render, to_dot, to_mermaid

__all__ = [
    "BUILDERS",
    "DEFAULT_INPUTS",
    "FIELDS",
    "KIND_ROLES",
    "WEIGHTS_STATE",
    "Edge",
    "ExecutionUnit",
    "FusedGroup",
    "Granularity",
    "Graph",
    "GraphError",
    "Params",
    "RECIPES",
    "RECIPE_NAMES",
    "Recipe",
    "Role",
    "Stage",
    "StageKind",
    "StateEdge",
    "bound_async",
    "build",
    "builder_names",
    "colocate",
    "dapo",
    "dr_grpo",
    "from_dict",
    "from_yaml",
    "fuse",
    "grpo",
    "has_graphviz",
    "ppo",
    "problems",
    "recipe",
    "reinforce_pp",
    "render",
    "rloo",
    "separate",
    "share_actor_critic",
    "to_dict",
    "to_dot",
    "to_mermaid",
    "to_yaml",
    "unfuse",
    "validate",
]
