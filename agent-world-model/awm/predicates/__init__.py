"""What the recovery method reads from an environment: task predicates, tool labels, verifier analysis.

    build.py              `awm predicates build|coverage` (`python -m awm.predicates`): each task's predicates
    predicate.py          one predicate: the record, phi_i(s) on a DB, extraction from a verifier's trace
    verifier_analysis.py  what a pure-code verifier reads and compares (ast + a traced sandbox run)
    tool_labels.py        `awm semantics`: read / create / update / delete per tool, from the handler code
"""
