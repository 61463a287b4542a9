"""The distributed runtime: Dask actors holding model shards (rank.py), the driver that runs
a compiled step on them (driver.py), the step scheduler, the staleness buffer, the data plane,
weight sync, checkpoints and the measured timeline. Imports torch and distributed; import submodules explicitly."""
