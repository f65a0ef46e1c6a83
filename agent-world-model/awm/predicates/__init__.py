"""What the recovery method reads from an environment: task predicates, tool labels, verifier analysis.

    build.py              `awm predicates build|coverage` (`python -m awm.predicates`): each task's predicates
    predicate.py          one predicate: the record, phi_i(s) on a DB, extraction from two final states
    verifier_analysis.py  what a pure-code verifier reads and compares (ast + a traced, optionally observed run)
    goal_states.py        without a reference solution: final states the verifier itself accepts (the search)
    proposals.py          the search's rules: from what the verifier compared to the edits that may satisfy it
    edits.py              those edits, and the scratch states they make from s0
    sql_shape.py          what one SELECT reads: tables, aliases, demanded equalities, output columns
    tool_labels.py        `awm semantics`: read / create / update / delete per tool, from the handler code
"""
