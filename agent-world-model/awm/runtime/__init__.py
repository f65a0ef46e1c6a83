"""The machinery behind `awm.episode.EnvRuntime`: generated code in locked-down worker processes.

    pool.py            the caller's side: spawn, place scenarios, send requests, restart dead workers
    wire.py            the frames between caller and worker (bounded JSON, never pickle)
    worker.py          the worker process (`python -m awm.runtime.worker`): locks itself down, serves calls
    envapp.py          generated FastAPI code loaded in a worker, routed to per-episode SQLite connections
    dispatch.py        a tool call straight to its endpoint with FastAPI's own validation (ASGI as fallback)
    request_params.py  query/path parameters read as FastAPI would, worked out once per route
    isolation.py       per-episode module state, guarded imports
    deadline.py        the soft per-call deadline that interrupts runaway handlers
"""
