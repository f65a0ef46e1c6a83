"""AWM-1K-compatible environments for RL on stateful, SQL-backed tools.

Modules, in the order data flows through them:

    data       AWM-1K files: indexed once, joined on scenario, duplicate verifiers resolved
    database   template DBs built once (DDL, INSERTs, failures reported, optional fixed clock)
    tools      tools as upstream exposes them (OpenAPI -> flat schemas), request/observation mapping
    envapp     generated FastAPI code loaded in a worker, routed to per-episode SQLite connections
    worker     the worker process;  wire: its frames;  pool: the caller's side of the workers
    episode    the Python API: EnvRuntime.open() -> Episode (tools, call, snapshot, verify, close)
    verifier   sandboxed code verifiers;  judge/llm: sql-mode LLM judge
    audit      flags verifiers that crash or pass on the untouched DB;  health: env health checks
    mcp_server MCP streamable HTTP in front of the runtime;  cli: the `awm` command

Importing `awm` itself is cheap: import the module you need (`from awm.episode import EnvRuntime`).
"""

__version__ = "0.1.0"
