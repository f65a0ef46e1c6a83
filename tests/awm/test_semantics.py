"""Tool labels from the environment code's database use (not from tool names), and task types."""

from __future__ import annotations

import asyncio
import json

from awm.data import AWMDataset, bundled_data_dir
from awm.episode import EnvRuntime
from awm.predicates.tool_labels import label_tools, main, probe_labels, task_type
from awm.solutions import load_probes, load_solutions

# Names lie on purpose: `get_orders` deletes, `delete_view` only reads, `list_settings` creates lazily.
APP = '''
from fastapi import FastAPI
from sqlalchemy import Column, Integer, String, text
from sqlalchemy.orm import declarative_base, sessionmaker
Base = declarative_base()
SessionLocal = sessionmaker()
app = FastAPI()


class Order(Base):
    __tablename__ = "orders"
    id = Column(Integer, primary_key=True)
    status = Column(String)


def _touch(session, order):
    order.status = "seen"


@app.get("/orders", operation_id="get_orders")
async def get_orders():
    session = SessionLocal()
    session.query(Order).filter(Order.status == "old").delete()
    session.commit()
    return {}


@app.delete("/view", operation_id="delete_view")
async def delete_view():
    session = SessionLocal()
    rows = session.query(Order).all()
    seen = set()
    seen.add(1)
    session.close()
    return rows


@app.get("/settings", operation_id="list_settings")
async def list_settings():
    db = SessionLocal()
    row = db.query(Order).first()
    if row is None:
        row = Order(status="new")
        db.add(row)
        db.commit()
    return row


@app.post("/orders", operation_id="make_order")
async def make_order():
    session = SessionLocal()
    session.add(Order(status="new"))
    session.flush()
    return {}


@app.patch("/orders/{oid}", operation_id="mark")
async def mark(oid: int):
    session = SessionLocal()
    order = session.get(Order, oid)
    _touch(session, order)
    session.commit()
    return {}


@app.post("/swap", operation_id="swap")
async def swap():
    session = SessionLocal()
    old = session.get(Order, 1)
    session.delete(old)
    session.add(Order(status="fresh"))
    session.commit()
    return {}


@app.post("/raw", operation_id="raw_sql")
async def raw_sql():
    session = SessionLocal()
    session.execute(text("UPDATE orders SET status = 'x'"))
    return {}


@app.put("/ping", operation_id="ping")
async def ping():
    return {"ok": True}
'''


def test_labels_come_from_code_not_names():
    labels = label_tools(APP)
    got = {name: (lab.label, lab.source) for name, lab in labels.items()}
    assert got == {
        "get_orders": ("delete", "code"),
        "delete_view": ("read", "code"),  # set.add is not a session write
        "list_settings": ("create", "code"),  # a GET with a hidden side effect
        "make_order": ("read", "code"),  # flushed, never committed: rolled back
        "mark": ("update", "code"),  # through a helper
        "swap": ("mixed", "code"),
        "raw_sql": ("update", "code"),
        "ping": ("update", "http_prior"),  # no database access at all: the method is all we have
    }
    assert any("without commit" in e for e in labels["make_order"].evidence)


def test_bundled_labels_and_runtime_probe(cache_dir):
    ds = AWMDataset(bundled_data_dir())
    labels = label_tools(ds.scenario("library_lending_1").full_code)
    assert labels["search_books"].label == "read" and labels["checkout_copy"].is_write
    assert labels["cancel_hold"].label == "update"  # DELETE route that marks a row cancelled
    sols = [s for k, s in load_solutions().items() if k[0] == "library_lending_1"]
    calls = load_probes()["library_lending_1"] + [c for s in sols for c in s.calls]

    async def run():
        with EnvRuntime(cache_dir=cache_dir, num_workers=1) as rt:
            await probe_labels(rt, "library_lending_1", labels, calls)

    asyncio.run(run())
    probed = [lab for lab in labels.values() if lab.runtime_calls]
    assert len(probed) >= 10
    assert all(lab.runtime_agrees is not False for lab in probed), [
        (lab.tool, lab.label, lab.runtime_changed) for lab in probed if lab.runtime_agrees is False]
    assert any(lab.is_write and lab.runtime_changed for lab in probed)


def test_task_type_rules():
    assert task_type(2, True, reads_final_answer=False, compares_states=True) == "state_mutating"
    assert task_type(0, False, reads_final_answer=True, compares_states=True) == "info_seeking"
    assert task_type(0, True, reads_final_answer=False, compares_states=True) == "ambiguous"
    assert task_type(1, None, reads_final_answer=False, compares_states=True) == "state_mutating"
    assert task_type(0, None, reads_final_answer=True, compares_states=False) == "info_seeking"
    assert task_type(0, None, reads_final_answer=False, compares_states=True) == "ambiguous"


def test_cli_tools_on_the_excerpt(excerpt_dir, tmp_path, capsys):
    out = tmp_path / "labels.jsonl"
    assert main(["tools", "--data-dir", str(excerpt_dir), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["scenario"] for r in rows} == {"content_platform_1", "code_hosting_2", "communication_messaging_1"}
    assert len(rows) == 34 + 61 + 33
    assert json.loads(capsys.readouterr().out)["tools"] == 128
