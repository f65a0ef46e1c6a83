"""Shared fixtures: the AWM-1K excerpt (read in place), the bundled data, synthetic scenarios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO.parent / "shared" / "awm_1k_excerpt"

# A tiny scenario whose routes misbehave on purpose: each fault of the issue has a route.
FAULT_APP = """
import os, time
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import Column, Integer, String, create_engine, text
from sqlalchemy.orm import declarative_base, sessionmaker

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/faults.db")
engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)
Base = declarative_base()


class Note(Base):
    __tablename__ = "notes"
    id = Column(Integer, primary_key=True)
    text = Column(String, nullable=False)


class Tag(Base):  # not in gen_db: the code's create_all adds it, as upstream's server would
    __tablename__ = "tags"
    id = Column(Integer, primary_key=True)
    name = Column(String)


Base.metadata.create_all(engine)
app = FastAPI(title="faults")


class NoteIn(BaseModel):
    text: str


class SqlIn(BaseModel):
    sql: str


@app.get("/notes", operation_id="list_notes", summary="List notes", description="All notes, optionally filtered.")
async def list_notes(q: str = ""):
    s = SessionLocal()
    rows = s.query(Note).filter(Note.text.like(f"%{q}%")).order_by(Note.id).all()
    out = [{"id": n.id, "text": n.text} for n in rows]
    s.close()
    return {"notes": out}


@app.get("/notes/{note_id}", operation_id="get_note", summary="Get a note")
async def get_note(note_id: int):
    s = SessionLocal()
    n = s.get(Note, note_id)
    s.close()
    if n is None:
        raise HTTPException(status_code=404, detail="note not found")
    return {"id": n.id, "text": n.text}


@app.post("/notes", operation_id="add_note", summary="Add a note")
async def add_note(body: NoteIn):
    s = SessionLocal()
    n = Note(text=body.text)
    s.add(n)
    s.commit()
    out = {"id": n.id, "text": n.text}
    s.close()
    return out


@app.post("/sql", operation_id="run_sql", summary="Run SQL (an injection hole on purpose)")
async def run_sql(body: SqlIn):
    s = SessionLocal()
    s.execute(text(body.sql))
    s.commit()
    s.close()
    return {"ok": True}


@app.post("/half", operation_id="half_write", summary="Write without commit, then fail")
async def half_write(body: NoteIn):
    s = SessionLocal()
    s.add(Note(text=body.text))
    s.flush()
    raise RuntimeError("failed after a flush")


@app.get("/boom", operation_id="boom", summary="Raise")
async def boom():
    return {"x": 1 / 0}


@app.get("/slow", operation_id="slow", summary="Sleep")
async def slow(seconds: float = 0.0):
    time.sleep(seconds)
    return {"slept": seconds}


@app.get("/env", operation_id="read_env", summary="Read an environment variable")
async def read_env(name: str):
    return {"value": os.environ.get(name)}


@app.get("/crash", operation_id="crash", summary="Kill the process")
async def crash():
    os._exit(3)
"""

FAULT_VERIFIER = """def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    conn = sqlite3.connect(final_db_path)
    n = conn.execute("SELECT COUNT(*) FROM notes WHERE text = 'buy milk'").fetchone()[0]
    conn.close()
    return {"result": "complete" if n == 1 else "others"}
"""


def write_scenarios(root: Path, scenarios: dict[str, str]) -> Path:
    """Write a data dir with one notes-table scenario per (name -> environment code)."""
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[dict]] = {
        k: [] for k in ("gen_tasks", "gen_db", "gen_sample", "gen_envs", "gen_verifier.pure_code")
    }
    for name, code in scenarios.items():
        files["gen_tasks"].append(
            {"scenario": name, "tasks": ["Add a note 'buy milk'."] + ["Do nothing."] * 9}
        )
        files["gen_db"].append(
            {
                "scenario": name,
                "db_path": None,
                "db_schema": {
                    "tables": [
                        {
                            "name": "notes",
                            "ddl": "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL, "
                            "created_at DATETIME DEFAULT CURRENT_TIMESTAMP);",
                            "indexes": ["CREATE INDEX idx_notes_text ON notes(text);"],
                        }
                    ]
                },
            }
        )
        files["gen_sample"].append(
            {
                "scenario": name,
                "tables_count": 1,
                "inserts_count": 2,
                "sample_data": {
                    "tables": [
                        {
                            "table_name": "notes",
                            "reasoning": "two notes",
                            "insert_statements": [
                                "INSERT INTO notes (id, text, created_at) VALUES (1, 'call mom', datetime('now', '-1 day'));",
                                "INSERT INTO notes (id, text) VALUES (2, 'water plants');",
                            ],
                        }
                    ]
                },
            }
        )
        files["gen_envs"].append({"scenario": name, "db_path": None, "full_code": code})
        files["gen_verifier.pure_code"].append(
            {
                "scenario": name,
                "task_idx": 0,
                "task": "Add a note 'buy milk'.",
                "verification": {"code": FAULT_VERIFIER, "raw_response": ""},
            }
        )
    for stage, rows in files.items():
        (root / f"{stage}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="session")
def excerpt_dir() -> Path:
    if not EXCERPT.is_dir():
        pytest.fail(f"the AWM-1K excerpt is not at {EXCERPT}: the tests read real AWM-1K records in place from "
                    "the shared folder beside the repository (CI has it); missing data fails, never skips")
    return EXCERPT


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One index/template cache per test session, never the user's ~/.cache."""
    return tmp_path_factory.mktemp("awm-cache")


@pytest.fixture(scope="session")
def fault_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scenarios(
        tmp_path_factory.mktemp("faults"),
        {
            "faults": FAULT_APP,
            "faults_twin": FAULT_APP,
            "broken_import": "raise RuntimeError('generated code is broken at import')\n",
            "broken_syntax": "def f(:\n",
        },
    )
