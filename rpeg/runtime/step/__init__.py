"""The step's I/O-free core (docs/step.md): events in, instructions out, as dask/distributed's
``worker_state_machine`` is built. Nothing here touches a process, a socket, a tensor or a
file; the driver (rpeg.runtime.actors.driver) and the Prefect flow feed it what happened and
carry out what it says. Under the purity contract (pyproject.toml: no torch, dask, prefect or
transformers, and nothing from the actors).

* :mod:`.scheduler` -- ``StepScheduler``: which units of which step to issue next, bounded
  asynchrony, retries after a lost worker;
* :mod:`.plan` -- ``StepPlan``: what the scheduler needs of a compiled step;
* :mod:`.messages` -- the events and instructions it exchanges, and its errors;
* :mod:`.invariants` -- the checks it runs after every event;
* :mod:`.staleness` -- the staleness buffer's bookkeeping (policy versions, the bound k);
* :mod:`.recovery` -- the recovery state machine after a failure in any phase;
* :mod:`.regeneration` -- which samples a recovered step regenerates.
"""
