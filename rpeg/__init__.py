"""RPEG: the RLM Pipeline Execution Graph.

Plan, predict and run reinforcement-learning training of reasoning language models.
See docs/architecture.md for the layers. Importing ``rpeg`` is cheap: it loads no torch,
dask or prefect.
"""

__version__ = "0.1.0"
