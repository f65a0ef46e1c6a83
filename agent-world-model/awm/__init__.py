"""AWM-1K-compatible environments for RL on stateful, SQL-backed tools.

Modules, in the order data flows through them:

    data       AWM-1K files: indexed once, joined on scenario, duplicate verifiers resolved
    database   template DBs built once (DDL, INSERTs, failures reported, optional fixed clock)
    tools      tools as upstream exposes them (OpenAPI -> flat schemas), request/observation mapping
    runtime/   generated code in locked-down worker processes (pool, wire, worker, envapp, dispatch, ...)
    episode    the Python API: EnvRuntime.open() -> Episode (tools, call, snapshot, verify, close)
    verifier   sandboxed code verifiers (sandbox: the lockdown they and the workers share);  judge/llm: LLM judge
    audit      flags verifiers that crash or pass on the untouched DB;  health: env health checks
    serve/     MCP streamable HTTP in front of the runtime (`awm env start`);  cli: the `awm` command
    predicates/  what the recovery method reads: task predicates, tool labels;  gen/: the synthesis pipeline

Importing `awm` itself is cheap: import the module you need (`from awm.episode import EnvRuntime`).
"""

from awm.moved import MOVED, register

__version__ = "0.1.0"

register(MOVED)
