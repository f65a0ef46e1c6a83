"""`awm gen`: synthesise AWM-1K environments with any OpenAI-compatible model.

Stages (awm-format.md section 9): scenario -> task -> db -> sample -> spec -> env -> verifier.
Each stage reads the accepted records of the stages before it from one output directory and
appends its own, in the exact AWM-1K formats, so the runtime loads the directory unchanged.
Unlike upstream, a record is written only after it passed validation that executes it (DDL,
INSERTs with foreign keys, every tool of the environment code, every verifier on the untouched
DB); what still fails after its retries goes to `rejects.jsonl` with the reasons.

Entry points: `awm.gen.runner.run_stages(GenConfig(...), stages, ChatClient(...))` and the CLI
(`awm.gen.cli`). This package imports nothing heavy, so `awm --help` stays fast.
"""

from awm.gen.config import STAGE_ORDER, GenConfig

__all__ = ["STAGE_ORDER", "GenConfig"]
