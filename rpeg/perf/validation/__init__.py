"""Validation of the performance model against published runs (pure; ``rpeg validate``).

Not the model itself (that is :mod:`rpeg.perf`): the published-run rows and how their cells
are read (:mod:`.rows`, :mod:`.row_cells`, :mod:`.row_text`, :mod:`.run_share`; a model the
catalog lacks: :mod:`.stand_in`; a name's words: :mod:`.model_words`), the check
of every row (:mod:`.published`), the leave-one-source-out check with its fit, ranges and
length prior (:mod:`.loso`, :mod:`.loso_fit`, :mod:`.loso_ranges`, :mod:`.loso_lengths`),
one-shot accuracy (:mod:`.loso_oneshot`), the error figures and what ``rpeg validate``
prints (:mod:`.loso_summary`, :mod:`.loso_report`), and the refit of the shipped system
table (:mod:`.systems_fit`). docs/validation.md and docs/perf-model.md describe them.
"""
