"""The default of each of a run's main knobs, written once (issue 27: one default per knob).

The config schema (:mod:`rpeg.config`) is where a user sees these: its fields read them
(``rpeg config docs`` prints them in docs/config.md). The pure layers below the config or
beside it (:mod:`rpeg.ir` may not import :mod:`rpeg.config`) read them here when they need a
fallback: the IR builders' options, the plan's staleness, the search space's on-policy
structure. Other layers take the value from :class:`rpeg.config.RunConfig` or as a required
argument. tests/test_one_default.py checks that no other module gives one of these knobs a
number literal.

This module imports nothing: it sits at the bottom of the layers contract with
:mod:`rpeg.errors`.
"""

# workload (rpeg.config.WorkloadConfig)
NUM_PROMPTS = 16  # prompts per RL step
SAMPLES_PER_PROMPT = 8  # responses per prompt (the group; the IR builders' group_size)
MAX_PROMPT_TOKENS = 32  # sized for the built-in tiny model on CPU
MAX_RESPONSE_TOKENS = 16
TRAIN_MINIBATCHES = 4  # optimizer steps per RL step
MICRO_BATCH_SIZE = 64  # samples per forward/backward micro-batch

#: ``rpeg plan --gpu/--cluster`` on a GPU cluster without a config file: a prompt length for
#: a real model (the workload's own default above is sized for the tiny CPU model). The one
#: other default of ``max_prompt_tokens``, and it lives here too.
GPU_MAX_PROMPT_TOKENS = 1024
GPU_MEAN_PROMPT_TOKENS = 150.0

#: a plan unit's micro-batch size where the plan does not give one (``UnitPlan``, the plan
#: builders, the search space's layouts): one sample per pass. A different knob from the
#: workload's ``MICRO_BATCH_SIZE``: generation units must use 1 (check_step refuses more) and
#: reward/advantage units run one pass over their rows; the default plan
#: (rpeg.compile.sources.default_plan) passes the workload's value to its forward units.
UNIT_MICRO_BATCH_SIZE = 1

# multi-turn rollouts: what the performance model assumes where task.multiturn does not say
# (rpeg.perf.turns.Turns; docs/multiturn.md "Pricing")
ENV_LATENCY_S = 0.01  # seconds per environment call: a local tool (measure yours: env_s)
MEAN_OBSERVATION_TOKENS = 16.0  # tokens an environment step appends (the calculator's ~19)

# algorithm (rpeg.config.AlgorithmConfig; the IR recipes' Knobs, where an algorithm's paper
# sets some apart: DAPO's clip_high 0.28, REINFORCE++'s gae_lambda 1.0, ...)
KL_COEF = 0.0  # no KL penalty until asked for
LR = 1e-4
CLIP_LOW = 0.2  # PPO ratio clip: 1 - clip_low
CLIP_HIGH = 0.2  # PPO ratio clip: 1 + clip_high
ENTROPY_COEF = 0.0
GAMMA = 1.0  # PPO/GAE discount
GAE_LAMBDA = 0.95
VALUE_CLIP = 0.2
MISMATCH_THRESHOLD = 0.2  # logprob_mismatch_frac_over counts tokens with |rho - 1| above this
OVERLONG_PENALTY_TOKENS = 0  # DAPO soft overlong punishment window; 0 = none

# sampling (rpeg.config.WorkloadConfig; the losses' and log-probs' temperature is the same)
TEMPERATURE = 1.0

#: a generate unit's KV-cache share of a device (vLLM's gpu_memory_utilization) where a plan
#: does not say (``UnitPlan``, the disaggregated plan builder)
GPU_MEMORY_UTILIZATION = 0.8
#: the same where generation shares its devices with training (the colocated plan builder,
#: verl's layout): the trainer's weights, gradients and optimizer state stay resident beside
#: the engine, so the engine takes less. The one other default of the knob, and it lives here.
COLOCATED_GPU_MEMORY_UTILIZATION = 0.6
#: the share the plan search gives a generate unit it lays out (rpeg.search: a candidate, not
#: a fallback; on its own devices in a disaggregated layout the engine can take more)
SEARCH_GPU_MEMORY_UTILIZATION = 0.85

# runtime (rpeg.config.RuntimeConfig)
MAX_STALENESS = 0  # bound k on policy-version lag: 0 = on-policy
CHECKPOINT_EVERY = 10  # steps
VAL_EVERY = 0  # validate every this many steps; 0 = only at the end (verl: trainer.test_freq)
VAL_BEFORE_TRAIN = True  # validate once before the first step (verl: val_before_train)
KEEP_LAST = 3  # complete checkpoints kept (older ones pruned)
TORCH_THREADS = 1  # torch intra-op threads per process (each rank's worker)

# cluster (rpeg.config.ClusterConfig; rpeg.infra's cluster bring-up)
N_WORKERS = 2  # LocalCluster worker processes
THREADS_PER_WORKER = 1

# task (rpeg.config.TaskConfig)
#: rewards by a row's data_source (verl's default_compute_score routing); keys are exact
#: names or fnmatch patterns, values reward names (rpeg.runtime.rewards)
REWARD_BY_SOURCE = {
    "openai/gsm8k": "exact_numeric",
    "gsm8k": "exact_numeric",
    "lighteval/MATH": "math_equivalence",
    "DigitalLearningGmbH/MATH-lighteval": "math_equivalence",
    "HuggingFaceH4/MATH-500": "math_equivalence",
    "math": "math_equivalence",
    "math_dapo": "math_equivalence",
    "aime*": "math_equivalence",
    "numina_*": "math_equivalence",
    "numeric": "exact_numeric",
}
