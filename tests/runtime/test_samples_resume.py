"""samples.jsonl after a resume or a recovery (issue 31 item 6): the rows of steps after the
checkpoint, logged before the interruption, are dropped, so the recomputed steps' rows
appear once."""

import json

from rpeg.runtime import samples as S


def _rows(step: int, n: int = 2) -> list[S.Sample]:
    return [S.Sample(step, i, "q", "r", "a", 0.5, 0.0, 0.1, 3, step - 1) for i in range(n)]


def test_rows_after_the_checkpoint_are_dropped_and_the_rest_kept_in_order(tmp_path):
    for step in (1, 2, 3):
        S.append_samples(tmp_path, _rows(step))
    with open(tmp_path / S.SAMPLES_FILE, "a") as fh:
        fh.write("not json\n")  # kept: not a row this function can place
    assert S.keep_samples_upto(tmp_path, 1) == 4  # steps 2 and 3, two rows each
    got = (tmp_path / S.SAMPLES_FILE).read_text().splitlines()
    assert got[-1] == "not json" and len(got) == 3
    assert [(json.loads(x)["step"], json.loads(x)["index"]) for x in got[:2]] == [(1, 0), (1, 1)]
    # the recomputed step 2 is appended once
    S.append_samples(tmp_path, _rows(2))
    assert S.keep_samples_upto(tmp_path, 2) == 0


def test_nothing_to_do_without_a_file(tmp_path):
    assert S.keep_samples_upto(tmp_path, 0) == 0
    assert not (tmp_path / S.SAMPLES_FILE).exists()
