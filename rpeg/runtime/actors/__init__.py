"""The distributed runtime: Dask actors holding model shards (rank.py), the driver that runs
a compiled step on them (driver.py), the staleness buffer, weight sync, checkpoints and the
measured timeline. Imports torch and distributed; import submodules explicitly."""
