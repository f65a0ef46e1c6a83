"""The prompts of every stage.

Each prompt opens with `Stage:` and `Scenario:` lines (and `Task index:` for verifiers): they
tell the model what it is doing, and they let logs and test servers tell requests apart.
Retries add the failed checks under the original request (see `with_feedback`).
"""

from __future__ import annotations

import json
from typing import Any

SYSTEM = ("You design simulated software applications that AI agents are trained in. Each application "
          "keeps its whole state in one SQLite database and is used through a REST API by a user who is "
          "already logged in as user_id 1. Follow the requested output format exactly.")


def messages(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def with_feedback(base: list[dict[str, str]], attempt: int, summary: str) -> list[dict[str, str]]:
    """The base request plus what failed last time (one user message: some chat templates refuse two)."""
    last = base[-1]
    note = (f"\n\nATTEMPT {attempt} WAS REJECTED. These checks failed:\n{summary}\n"
            "Write a complete new answer that fixes every problem above, in the same format.")
    return [*base[:-1], {**last, "content": last["content"] + note}]


def _tasks(tasks: list[str]) -> str:
    return "\n".join(f"{i}. {t}" for i, t in enumerate(tasks))


def _schema(db_schema: dict[str, Any]) -> str:
    return "\n".join("\n".join([t["ddl"], *t.get("indexes", [])]) for t in db_schema["tables"])


def _sample(sample_data: dict[str, Any], max_chars: int = 12000) -> str:
    text = "\n".join(s for t in sample_data["tables"] for s in t["insert_statements"])
    return text if len(text) <= max_chars else text[:max_chars] + "\n-- ... (more rows cut)"


def scenario_prompt(n: int, examples: list[dict[str, str]], avoid: list[str]) -> str:
    shown = "\n".join(f"- {e['name']}: {e['description']}" for e in examples) or "(none)"
    return f"""Stage: scenario
Propose {n} new scenarios: everyday web or mobile applications (shops, bookings, trackers, tools for
work or hobbies) that can be simulated with a database and an API. Each scenario needs a short name and a
description of 100-300 words naming the main entities, what a user can look up, and what a user can
change.

Examples of the expected kind and level of detail:
{shown}

Do not repeat or closely paraphrase these existing scenarios: {", ".join(avoid) or "(none)"}

Answer with a JSON list only: [{{"name": "...", "description": "..."}}, ...]"""


def task_prompt(name: str, description: str, n: int) -> str:
    return f"""Stage: task
Scenario: {name}
Description: {description}

Write {n} different tasks a user of this application could ask an assistant to do through its API.
Rules:
- each task is self-contained and names every value it needs (names, dates, amounts, quantities);
- the user is already logged in as user_id 1: no login, sign-up or password tasks;
- mix tasks that change the state (create, update, cancel, delete) with questions whose answer is a
  value read from the data;
- every task must be solvable with data a realistic initial database of the application would hold.

Answer with JSON only: {{"tasks": ["...", ...]}}"""


def db_prompt(name: str, description: str, tasks: list[str]) -> str:
    return f"""Stage: db
Scenario: {name}
Description: {description}
Tasks the database must support:
{_tasks(tasks)}

Design the SQLite schema. Rules:
- one CREATE TABLE statement per table, tables ordered so that referenced tables come first;
- `id INTEGER PRIMARY KEY` in every table; FOREIGN KEY ... REFERENCES for relations; NOT NULL, UNIQUE,
  CHECK and DEFAULT where they make sense; times as DATETIME DEFAULT CURRENT_TIMESTAMP;
- a `users` table (the logged-in user is id 1) when the application has users; no password or token columns;
- indexes for the columns the tasks search by.

Answer with JSON only:
{{"tables": [{{"name": "users", "ddl": "CREATE TABLE users (...);", "indexes": ["CREATE INDEX ...;"]}}, ...]}}"""


def sample_prompt(name: str, tasks: list[str], db_schema: dict[str, Any]) -> str:
    return f"""Stage: sample
Scenario: {name}
Tasks:
{_tasks(tasks)}
Schema:
{_schema(db_schema)}

Write the initial data. Rules:
- INSERT statements that name their columns: INSERT INTO t (a, b) VALUES (...);
- foreign keys are enforced: insert parents before children; the user with id 1 comes first;
- give explicit ids; 5-10 rows for entities the tasks list or search; every name, date or amount a task
  mentions must exist so that every task can be solved;
- dates relative to now, e.g. datetime('now', '-3 days').

Answer with JSON only:
{{"tables": [{{"table_name": "...", "reasoning": "why these rows", "insert_statements": ["INSERT ...;"]}}, ...]}}"""


def spec_prompt(name: str, tasks: list[str], db_schema: dict[str, Any]) -> str:
    return f"""Stage: spec
Scenario: {name}
Tasks:
{_tasks(tasks)}
Schema:
{_schema(db_schema)}

Design the REST API a user needs for these tasks and the natural features around them (search, list,
detail, create, update, delete). Use snake_case operation ids, `/api/...` paths and path parameters for ids.

Answer with JSON only:
{{"api_groups": [{{"group_name": "...", "endpoints": [{{"path": "/api/items/{{item_id}}", "method": "GET",
  "summary": "...", "description": "...", "operation_id": "get_item", "tags": ["items"],
  "request_params": {{"item_id": {{"type": "integer", "param_type": "path", "required": true,
  "description": "...", "example": 1}}}}, "response": {{"id": {{"type": "integer", "description": "...",
  "example": 1}}}}, "required_tables": ["items"], "required_fields": {{"items": ["id"]}}}}]}}]}}"""


def env_prompt(name: str, db_schema: dict[str, Any], api_spec: dict[str, Any]) -> str:
    return f"""Stage: env
Scenario: {name}
Schema:
{_schema(db_schema)}
API spec:
{json.dumps(api_spec, ensure_ascii=False)}

Write the server as one self-contained Python module:
- FastAPI app named `app`; SQLAlchemy declarative models with exactly the tables and columns of the schema;
  Pydantic v2 request/response models (model_config = ConfigDict(from_attributes=True));
- engine = create_engine(os.getenv("DATABASE_PATH", "sqlite:///{name}.db"), connect_args={{"check_same_thread": False}});
  SessionLocal = sessionmaker(bind=engine); Base.metadata.create_all(engine);
- one route per endpoint of the spec, each with operation_id (as in the spec), summary, description, tags;
- handlers open a session, work, commit and close it; the user is user_id 1 (no authentication);
- a missing row or an invalid request answers with HTTPException(404 or 400) or {{"success": false, ...}}:
  an unhandled exception (HTTP 500) anywhere fails the code;
- `if __name__ == "__main__":` runs uvicorn on os.getenv("HOST", "127.0.0.1") and int(os.getenv("PORT", "8000")).
Every route will be called with sample arguments when your code is checked.

Answer with the code in one ```python block."""


def verifier_prompt(name: str, task_idx: int, task: str, db_schema: dict[str, Any],
                    sample_data: dict[str, Any]) -> str:
    return f"""Stage: verifier
Scenario: {name}
Task index: {task_idx}
Task: {task}
Schema:
{_schema(db_schema)}
Initial data:
{_sample(sample_data)}

Write a deterministic Python function
    def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict
that returns {{"result": "complete"}} only when it is certain the task was done, else {{"result": "others"}}.
- import what you need (sqlite3, json, re) inside the function; open both databases read-only;
- for a task that changes the state, compare the initial and the final database and check the specific
  change the task asks for: a row that already exists in the initial data proves nothing;
- for a question, compute the right value from the database and check that final_answer contains it;
- it is run on the untouched database with an empty answer and must return "others" there.

Answer with JSON only: {{"reasoning": "...", "task_type": "state_mutating" or "info_seeking",
"verification_strategy": "query_based" or "modification_based" or "combined",
"python_code": "def verify_task_completion(...):\\n    ...", "function_name": "verify_task_completion"}}"""


def sql_verifier_prompt(name: str, task_idx: int, task: str, db_schema: dict[str, Any],
                        sample_data: dict[str, Any]) -> str:
    return f"""Stage: verifier (sql mode)
Scenario: {name}
Task index: {task_idx}
Task: {task}
Schema:
{_schema(db_schema)}
Initial data:
{_sample(sample_data)}

Write a deterministic Python function
    def verify_task(initial_db_path: str, final_db_path: str) -> dict
that gathers the database evidence a judge needs to decide whether the task was done: query both databases
read-only and return a JSON-serialisable dict of the relevant rows before and after (no verdict of its own).
Import what you need (sqlite3, json) inside the function. It must also run on the untouched database.

Answer with JSON only: {{"reasoning": "...", "python_code": "def verify_task(...):\\n    ...",
"function_name": "verify_task", "success_criteria": "...", "failure_criteria": "..."}}"""
