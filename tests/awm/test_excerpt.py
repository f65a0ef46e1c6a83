"""Conformance on real AWM-1K records: the generated environment code of the excerpt runs."""

from __future__ import annotations

import asyncio
import json

from awm.episode import EnvRuntime
from awm.health import check_scenario


def test_content_platform_1_lists_34_tools_and_every_read_tool_answers(excerpt_dir, cache_dir):
    async def main():
        with EnvRuntime(excerpt_dir, num_workers=1, cache_dir=cache_dir) as rt:
            tools = await rt.tools("content_platform_1")
            health = await check_scenario(rt, "content_platform_1")
            spec = rt.dataset.scenario("content_platform_1").api_spec
            return tools, health, spec

    tools, health, spec = asyncio.run(main())
    assert len(tools) == 34
    spec_ids = {e["operation_id"] for g in spec["api_groups"] for e in g["endpoints"]}
    assert {t["name"] for t in tools} == spec_ids
    assert health.read_tools == 16 and health.server_errors == [], health.server_errors
    assert health.ok


def test_other_excerpt_environments_load_and_list_tools(excerpt_dir, cache_dir):
    async def main():
        with EnvRuntime(excerpt_dir, num_workers=2, cache_dir=cache_dir) as rt:
            hosting = await rt.tools("code_hosting_2")  # schema only: the excerpt has no sample data for it
            mail = await rt.tools("communication_messaging_1")  # no gen_db: its code's create_all builds the schema
            _, mail_report = rt.template("communication_messaging_1")
            ep = await rt.open("communication_messaging_1")
            inbox = [await ep.call(t["name"], {}) for t in mail if t["name"] == "list_labels"]
            return hosting, mail, mail_report, inbox

    hosting, mail, report, inbox = asyncio.run(main())
    assert len(hosting) == 61 and len(mail) == 33
    # 138 of 139 INSERTs: the release's one dangling reference (vacation_responder_logs -> email 16) fails
    assert (report.inserts_ok, report.inserts_total) == (138, 139)
    assert len(report.env_created_tables) >= 22
    assert inbox and not inbox[0].is_error and json.loads(inbox[0].text)
