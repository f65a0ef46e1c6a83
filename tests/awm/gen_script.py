"""Scripted model replies for the `awm gen` pipeline tests: one good scenario reached through
every kind of failure (malformed JSON, broken INSERTs, a failing route, verifiers that pass on
the untouched DB) and one scenario whose DDL never executes."""

from __future__ import annotations

import json

from fake_llm import FakeOpenAI

WORDS = " ".join(["It", "keeps", "lists", "and", "items", "in", "one", "database", "for", "the", "user."] * 4)
SCENARIOS = json.dumps([
    {"name": "Todo Board", "description": f"Todo Board: people organise to-do lists. {WORDS}"},
    {"name": "todo_board", "description": f"A second todo board. {WORDS}"},
    {"name": "Task Lists", "description": f"Task lists for chores, much like a todo board. {WORDS}"},
    {"name": "Pet Clinic", "description": f"Pet Clinic: owners book visits for their pets. {WORDS}"},
])

TASKS = ["Add an item 'buy milk' to the list 'Groceries'.", "Mark the item 'call plumber' as done.",
         "How many open items does the list 'Home' have?", "Delete the item 'old task'.",
         "Rename nothing, just add 'eggs' to 'Groceries'.", "Add 'bread' to 'Groceries'.",
         "Add 'fix door' to 'Home'.", "Add 'paint fence' to 'Home'.", "Add 'tea' to 'Groceries'.",
         "Add 'soap' to 'Groceries'."]

TABLES = {"tables": [
    {"name": "users", "ddl": "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL);", "indexes": []},
    {"name": "lists", "ddl": "CREATE TABLE lists (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL "
     "REFERENCES users(id), title TEXT NOT NULL);", "indexes": ["CREATE INDEX idx_lists_title ON lists(title);"]},
    {"name": "items", "ddl": "CREATE TABLE items (id INTEGER PRIMARY KEY, list_id INTEGER NOT NULL "
     "REFERENCES lists(id), text TEXT NOT NULL, done INTEGER NOT NULL DEFAULT 0, "
     "created_at DATETIME DEFAULT CURRENT_TIMESTAMP);", "indexes": []},
]}

GOOD_INSERTS = [
    "INSERT INTO users (id, name) VALUES (1, 'Ada');",
    "INSERT INTO lists (id, user_id, title) VALUES (1, 1, 'Groceries');",
    "INSERT INTO lists (id, user_id, title) VALUES (2, 1, 'Home');",
    "INSERT INTO items (id, list_id, text, done, created_at) VALUES (1, 2, 'call plumber', 0, datetime('now', '-1 day'));",
    "INSERT INTO items (id, list_id, text) VALUES (2, 2, 'old task');",
    "INSERT INTO items (id, list_id, text) VALUES (3, 1, 'apples');",
]
# Items before their lists and on a list that never exists: foreign keys fail for 3 of 6.
BAD_INSERTS = [GOOD_INSERTS[0], GOOD_INSERTS[3], GOOD_INSERTS[4],
               "INSERT INTO items (id, list_id, text) VALUES (3, 99, 'apples');", GOOD_INSERTS[1], GOOD_INSERTS[2]]

SPEC = {"api_groups": [{"group_name": "Lists", "endpoints": [
    {"path": "/api/lists", "method": "GET", "summary": "List my lists", "description": "Lists of user 1.",
     "operation_id": "list_lists", "tags": ["lists"], "request_params": {}, "response": {},
     "required_tables": ["lists"], "required_fields": {"lists": ["id", "title"]}},
    {"path": "/api/lists/{list_id}/items", "method": "POST", "summary": "Add an item", "description": "Add.",
     "operation_id": "add_item", "tags": ["items"],
     "request_params": {"list_id": {"type": "integer", "param_type": "path", "required": True},
                        "text": {"type": "string", "param_type": "body", "required": True}},
     "response": {}, "required_tables": ["items"], "required_fields": {"items": ["text"]}},
]}]}

ENV_CODE = '''
import os
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import Column, ForeignKey, Integer, String, create_engine, text
from sqlalchemy.orm import declarative_base, sessionmaker

engine = create_engine(os.getenv("DATABASE_PATH", "sqlite:///todo_board.db"), connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine)
Base = declarative_base()


class TodoList(Base):
    __tablename__ = "lists"
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, nullable=False)
    title = Column(String, nullable=False)


class Item(Base):
    __tablename__ = "items"
    id = Column(Integer, primary_key=True)
    list_id = Column(Integer, ForeignKey("lists.id"), nullable=False)
    text = Column(String, nullable=False)
    done = Column(Integer, nullable=False, default=0)


Base.metadata.create_all(engine)
app = FastAPI(title="Todo Board")


class ItemIn(BaseModel):
    text: str


@app.get("/api/lists", operation_id="list_lists", summary="List my lists", tags=["lists"])
async def list_lists():
    s = SessionLocal()
    out = [{"id": t.id, "title": t.title} for t in s.query(TodoList).filter(TodoList.user_id == 1)]
    s.close()
    return {"lists": out}


@app.get("/api/lists/{list_id}/items", operation_id="list_items", summary="Items of a list", tags=["items"])
async def list_items(list_id: int, open_only: bool = False):
    s = SessionLocal()
    q = s.query(Item).filter(Item.list_id == list_id)
    if open_only:
        q = q.filter(Item.done == 0)
    out = [{"id": i.id, "text": i.text, "done": bool(i.done)} for i in q]
    s.close()
    return {"items": out}


@app.get("/api/search", operation_id="search_items", summary="Search items", tags=["items"])
async def search_items(query: str):
    s = SessionLocal()
    rows = s.execute(text("SELECT id, text FROM items WHERE COLUMN_NAME LIKE :q"), {"q": f"%{query}%"}).fetchall()
    s.close()
    return {"items": [{"id": r[0], "text": r[1]} for r in rows]}


@app.post("/api/lists/{list_id}/items", operation_id="add_item", summary="Add an item", tags=["items"])
async def add_item(list_id: int, body: ItemIn):
    s = SessionLocal()
    if s.get(TodoList, list_id) is None:
        s.close()
        raise HTTPException(status_code=404, detail="list not found")
    item = Item(list_id=list_id, text=body.text)
    s.add(item)
    s.commit()
    out = {"id": item.id, "text": item.text}
    s.close()
    return out


@app.patch("/api/items/{item_id}", operation_id="complete_item", summary="Mark done", tags=["items"])
async def complete_item(item_id: int):
    s = SessionLocal()
    item = s.get(Item, item_id)
    if item is None:
        s.close()
        return {"success": False}
    item.done = 1
    s.commit()
    s.close()
    return {"success": True}


@app.delete("/api/items/{item_id}", operation_id="delete_item", summary="Delete an item", tags=["items"])
async def delete_item(item_id: int):
    s = SessionLocal()
    item = s.get(Item, item_id)
    if item is None:
        s.close()
        raise HTTPException(status_code=404, detail="item not found")
    s.delete(item)
    s.commit()
    s.close()
    return {"success": True}


if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host=os.getenv("HOST", "127.0.0.1"), port=int(os.getenv("PORT", "8000")))
'''
GOOD_ENV = ENV_CODE.replace("COLUMN_NAME", "text")
BAD_ENV = ENV_CODE.replace("COLUMN_NAME", "txt")  # search_items: sqlite "no such column" -> HTTP 500

ADDED_ITEM = '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    def count(path):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        n = conn.execute("SELECT COUNT(*) FROM items WHERE text = ?", (%r,)).fetchone()[0]
        conn.close()
        return n
    return {"result": "complete" if count(final_db_path) > count(initial_db_path) else "others"}
'''
ALWAYS_COMPLETE = 'def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n' \
                  '    return {"result": "complete"}\n'
ROW_EXISTS = '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    conn = sqlite3.connect(final_db_path)
    found = conn.execute("SELECT COUNT(*) FROM items WHERE text = 'call plumber'").fetchone()[0]
    conn.close()
    return {"result": "complete" if found else "others"}
'''
NEEDLE = {0: "buy milk", 2: "two", 3: "old task", 4: "eggs", 5: "bread", 6: "fix door", 7: "paint fence",
          8: "tea", 9: "soap"}


def sample_data(statements: list[str]) -> dict:
    """Statements grouped by table, tables in order of first appearance (as a model would write them)."""
    tables: dict[str, list[str]] = {}
    for stmt in statements:
        tables.setdefault(stmt.split()[2], []).append(stmt)
    return {"tables": [{"table_name": t, "reasoning": "rows the tasks need", "insert_statements": rows}
                       for t, rows in tables.items()]}


def verifier_reply(code: str, task_type: str = "state_mutating") -> str:
    return json.dumps({"reasoning": "compare before and after", "task_type": task_type,
                       "verification_strategy": "modification_based", "python_code": code,
                       "function_name": "verify_task_completion"})


def fenced(code: str) -> str:
    return f"Here is the server.\n```python\n{code}\n```\n"


def script_pipeline(fake: FakeOpenAI) -> None:
    """Every reply of the whole pipeline run (see test_gen_pipeline.py for the expected counts)."""
    fake.script("Stage: scenario", replies=[SCENARIOS])
    fake.embedding("todo_board:", [1.0, 0.0, 0.0])
    fake.embedding("task_lists:", [0.95, 0.1, 0.0])  # cosine 0.994 with todo_board: a near duplicate
    fake.embedding("pet_clinic:", [0.0, 1.0, 0.0])
    fake.script("Stage: task", "Scenario: todo_board\n", replies=['{"tasks": ["Add milk", "Add', json.dumps({"tasks": TASKS})])
    fake.script("Stage: task", "Scenario: pet_clinic\n", replies=[json.dumps({"tasks": [f"Book visit {i}." for i in range(12)]})])
    fake.script("Stage: db", "Scenario: todo_board\n", replies=[json.dumps(TABLES)])
    fake.script("Stage: db", "Scenario: pet_clinic\n", replies=[json.dumps({"tables": [
        {"name": "pets", "ddl": "CREATE TABLE pets (id INTEGER PRIMARY KEY, name TEXT NOT NULL,);", "indexes": []}]})])
    fake.script("Stage: sample", "Scenario: todo_board\n",
                replies=[json.dumps(sample_data(BAD_INSERTS)), json.dumps(sample_data(GOOD_INSERTS))])
    fake.script("Stage: spec", "Scenario: todo_board\n", replies=[json.dumps(SPEC)])
    fake.script("Stage: env", "Scenario: todo_board\n", replies=[fenced(BAD_ENV), fenced(GOOD_ENV)])
    for idx in range(10):
        needles = ("Stage: verifier\n", "Scenario: todo_board\n", f"Task index: {idx}\n")
        if idx == 0:
            replies = [verifier_reply(ALWAYS_COMPLETE), verifier_reply(ADDED_ITEM % "buy milk")]
        elif idx == 1:
            replies = [verifier_reply(ROW_EXISTS)]
        elif idx == 3:
            replies = ['{"python_code": "def verify_task_completion(', verifier_reply(ADDED_ITEM % NEEDLE[idx])]
        else:
            replies = [verifier_reply(ADDED_ITEM % NEEDLE[idx])]
        fake.script(*needles, replies=replies)
