"""One declaration per RL algorithm: what its step holds and where its KL term goes.

A :class:`Recipe` is pure data. The IR builders (:mod:`rpeg.ir.builders`) read it for the
stages and the defaults of their options; the runtime's math for each recipe lives in
``rpeg/runtime/recipes/<name>.py`` (advantage and loss terms over tensors). The config's
``algorithm.name`` takes exactly these names (tests/ir/test_recipes.py checks it).

Where the KL to the frozen reference goes (``kl``), as verl spells the two switches
(``actor_rollout_ref.actor.use_kl_loss`` and ``algorithm.use_kl_in_reward``):

* ``"loss"``: ``+ kl_coef * aggregate(KL(pi_theta || pi_ref))`` in the policy loss,
  differentiated (GRPO, Shao et al. 2024, arXiv:2402.03300, eq. 3, with the k3 estimator).
* ``"reward"``: ``- kl_coef * KL(pi_old || pi_ref)`` subtracted from the reward before the
  advantage, a constant for the update (InstructGPT-style PPO, Ouyang et al. 2022,
  arXiv:2203.02155; REINFORCE++, Hu 2025, arXiv:2501.03262, per token; RLOO, Ahmadian et
  al. 2024, arXiv:2402.14740, per sequence).
* ``"none"``: no KL term and no reference model (DAPO, Yu et al. 2025, arXiv:2503.14476,
  section 2.3 "Removing KL Divergence").

Defaults (:class:`Knobs`): one value per knob. :data:`KNOBS` holds the values every recipe
shares; they equal the config's defaults (``rpeg.config.AlgorithmConfig`` and
``WorkloadConfig.samples_per_prompt``). rpeg.ir may not import the config, so the main
knobs' (``kl_coef``, ``group_size``) come from :mod:`rpeg.defaults`, the one module the
config's fields read them from too; tests/ir/test_ir_recipes.py asserts the others equal.
A recipe's ``defaults`` replace only the knobs its paper sets differently (DAPO's
clip-higher, Dr.GRPO's sum over tokens): its ``presets``.
Pure: no torch, dask or prefect.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Literal

from rpeg import defaults
from rpeg.errors import Problem, ProblemsError

KLPlacement = Literal["loss", "reward", "none"]
KL_PLACEMENTS: tuple[str, ...] = ("loss", "reward", "none")


@dataclass(frozen=True)
class Knobs:
    """The default of every algorithm knob a builder takes (the config's names in brackets
    where they differ)."""

    use_reference: bool = True
    kl_coef: float = defaults.KL_COEF
    clip_low: float = defaults.CLIP_LOW
    clip_high: float = defaults.CLIP_HIGH
    dual_clip: float | None = None
    dynamic_sampling: bool = False
    overlong_buffer: int | None = None  # [overlong_penalty_tokens; 0 there = None here]
    loss_aggregation: str = "token_mean"
    entropy_coef: float = defaults.ENTROPY_COEF
    group_size: int = defaults.SAMPLES_PER_PROMPT  # [workload.samples_per_prompt]
    gamma: float = defaults.GAMMA
    gae_lambda: float = defaults.GAE_LAMBDA
    value_clip: float | None = defaults.VALUE_CLIP


#: the defaults every recipe shares (the config's defaults)
KNOBS = Knobs()


@dataclass(frozen=True)
class Recipe:
    """One algorithm. ``advantage`` names the estimator (``rpeg/runtime/recipes/<name>.py``
    computes it); ``critic``: a value model and a ``train_critic`` stage; ``group_baseline``:
    the advantage compares a sample with its prompt's other samples (needs >= 2 of them);
    ``defaults``: :data:`KNOBS` with the knobs this algorithm's paper sets apart."""

    name: str
    title: str
    kl: KLPlacement
    advantage: str
    critic: bool
    group_baseline: bool
    defaults: Knobs = KNOBS
    sources: tuple[str, ...] = ()

    @property
    def presets(self) -> dict[str, object]:
        """The knobs whose default differs from :data:`KNOBS` (what the paper sets)."""
        return {
            f.name: getattr(self.defaults, f.name)
            for f in fields(Knobs)
            if getattr(self.defaults, f.name) != getattr(KNOBS, f.name)
        }

    @property
    def uses_reference(self) -> bool:
        """Whether a reference model can matter: False where the recipe has no KL term."""
        return self.kl != "none"


RECIPES: MappingProxyType = MappingProxyType(
    {
        r.name: r
        for r in (
            Recipe(
                "grpo",
                "GRPO",
                kl="loss",
                advantage="group mean/std: (r - mean_g r) / (std_g r + eps)",
                critic=False,
                group_baseline=True,
                sources=(
                    "Shao et al. 2024, DeepSeekMath, arXiv:2402.03300 (eq. 3: k3 KL in the loss)",
                ),
            ),
            Recipe(
                "dr_grpo",
                "Dr.GRPO",
                kl="loss",
                advantage="group mean only: r - mean_g r (no std)",
                critic=False,
                group_baseline=True,
                defaults=replace(KNOBS, loss_aggregation="seq_mean_token_sum"),
                sources=(
                    "Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783 "
                    "(no std and no length normalisation)",
                ),
            ),
            Recipe(
                "dapo",
                "DAPO",
                kl="none",
                advantage="group mean/std, as GRPO",
                critic=False,
                group_baseline=True,
                defaults=replace(
                    KNOBS,
                    use_reference=False,
                    clip_high=0.28,
                    dynamic_sampling=True,
                    overlong_buffer=4096,
                ),
                sources=(
                    "Yu et al. 2025, DAPO, arXiv:2503.14476 (clip-higher 0.28, dynamic "
                    "sampling, token-level loss, overlong shaping with a 4096-token buffer, no KL)",
                ),
            ),
            Recipe(
                "rloo",
                "RLOO",
                kl="reward",
                advantage="leave-one-out: r_i - mean_{j != i} r_j, KL summed into r",
                critic=False,
                group_baseline=True,
                sources=(
                    "Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740 (sequence-level "
                    "KL penalty in the reward)",
                    "Kool et al. 2019, Buy 4 REINFORCE samples, get a baseline for free",
                ),
            ),
            Recipe(
                "reinforce_pp",
                "REINFORCE++",
                kl="reward",
                advantage="token returns of (outcome - kl_coef * KL_t), whitened over the batch",
                critic=False,
                group_baseline=False,
                sources=("Hu 2025, REINFORCE++, arXiv:2501.03262 (token-level KL in the reward)",),
            ),
            Recipe(
                "ppo",
                "PPO",
                kl="reward",
                advantage="GAE over the critic's values of (outcome - kl_coef * KL_t), whitened",
                critic=True,
                group_baseline=False,
                sources=(
                    "Schulman et al. 2017, PPO, arXiv:1707.06347; GAE, arXiv:1506.02438",
                    "Ouyang et al. 2022, InstructGPT, arXiv:2203.02155 (per-token KL in the reward)",
                ),
            ),
        )
    }
)

#: the algorithm names, as the config's ``algorithm.name`` takes them
RECIPE_NAMES: tuple[str, ...] = tuple(RECIPES)

ALIASES = MappingProxyType(
    {
        "reinforce++": "reinforce_pp",
        "reinforce-pp": "reinforce_pp",
        "reinforcepp": "reinforce_pp",
        "dr.grpo": "dr_grpo",
        "dr-grpo": "dr_grpo",
        "drgrpo": "dr_grpo",
    }
)


class UnknownRecipe(ProblemsError):
    title = "unknown algorithm"


def canonical(name: str) -> str:
    """``name`` as a recipe's name (aliases such as ``reinforce++`` resolved, any case)."""
    key = str(name).lower()
    return ALIASES.get(key, key)


def recipe(name: str) -> Recipe:
    """The recipe called ``name`` (or an alias of it); an unknown name lists the known ones."""
    r = RECIPES.get(canonical(name))
    if r is None:
        raise UnknownRecipe(
            [Problem("algorithm.name", f"{name!r} is not one of {', '.join(RECIPE_NAMES)}")]
        )
    return r
