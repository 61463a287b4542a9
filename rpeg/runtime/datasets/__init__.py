"""Data as users have it: verl's and TRL's formats with their own column names.

* :mod:`.files`: rows from JSONL, Parquet, or a Hugging Face ``datasets`` folder (its
  ``save_to_disk`` Arrow files, or a folder of Parquet/JSONL files), read with pyarrow and
  json only (nothing in a data file is executed); a row becomes an
  :class:`rpeg.runtime.data.Example` through :class:`.files.RowKeys` (``task.prompt_key``:
  text or a list of chat messages; ``task.answer_key``: a dotted path such as
  ``reward_model.ground_truth``; ``task.system_prompt``).
* :mod:`.prompts`: the exact prompt text the model gets (the tokenizer's chat template with
  the generation prompt, ``task.chat_template``), prompt lengths in tokens, and what happens
  to prompts over ``workload.max_prompt_tokens`` (``task.overlong``).
"""
