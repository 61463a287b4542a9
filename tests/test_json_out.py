"""Strict JSON from every ``--json`` command (rpeg.cli.json_out)."""

import json
import math

import pytest

from rpeg.cli import json_out


def test_non_finite_figures_are_null_at_any_depth():
    obj = {"a": math.nan, "b": [1.5, math.inf, (-math.inf, 2)], "c": {"d": {"e": math.nan}}}
    text = json_out.dumps(obj)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": [1.5, None, [None, 2]], "c": {"d": {"e": None}}}
    # finite values, other types and keys pass unchanged; json's own options still apply
    assert json.loads(json_out.dumps({"n": 3, "s": "x", "t": True, "z": None, "f": 0.25})) == {
        "n": 3, "s": "x", "t": True, "z": None, "f": 0.25,
    }  # fmt: skip
    assert json_out.dumps({"p": object()}, default=lambda o: "obj") == '{"p": "obj"}'


def test_a_non_finite_number_json_cannot_hold_is_refused_not_written():
    class Odd:  # a number the walk does not know, serialised by a default that yields NaN
        pass

    with pytest.raises(ValueError):
        json_out.dumps({"x": Odd()}, default=lambda o: math.nan)
