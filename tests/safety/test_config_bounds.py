"""Issue 44, items 9 and 11: numbers that can only fail later are refused by the config,
naming the field: a seed beyond 32 bits, a learning rate of 1e30."""

from __future__ import annotations

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError


@pytest.mark.parametrize("seed", [2**70, 2**32, -1])
def test_a_seed_outside_32_bits_is_refused(seed):
    with pytest.raises(ConfigError, match="runtime.seed"):
        RunConfig().with_overrides({"runtime.seed": seed})


def test_a_32_bit_seed_is_kept():
    assert RunConfig().with_overrides({"runtime.seed": 2**32 - 1}).runtime.seed == 2**32 - 1


@pytest.mark.parametrize("field", ["optim.lr", "optim.critic_lr", "optim.warmup_sft_lr"])
def test_an_absurd_learning_rate_is_refused_before_start(field):
    with pytest.raises(ConfigError, match=field.replace(".", "\\.")):
        RunConfig().with_overrides({field: 1e30})


def test_the_cli_refuses_lr_1e30_with_exit_2(capsys):
    from rpeg.cli import main

    assert main(["config", "show", "optim.lr=1e30"]) == 2
    assert "optim.lr" in capsys.readouterr().err
