"""The parts of run_upstream_examples.py that need no upstream checkout: reading launch scripts, turning
them into a CPU command, the scratch copy, and the retrieval server's protocol. CI has no copy of
upstream's files, so the harness itself is only run by hand; these keep it from rotting in between."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_upstream_examples as harness  # noqa: E402

SCRIPT = """#!/bin/bash
pkill -9 sglang
source "${SCRIPT_DIR}/../../scripts/models/qwen3-4B.sh"

CKPT_ARGS=(
   --hf-checkpoint /root/Qwen3-4B
   --ref-load /root/Qwen3-4B_torch_dist
   # --load /root/commented-out
)

ROLLOUT_ARGS=(
   --prompt-data /root/data.jsonl
   --input-key prompt
   --apply-chat-template
   --num-rollout 3000
   --rollout-batch-size 32   # trailing comment
   --tensor-model-parallel-size 2
   --context-parallel-size 1
   --sglang-cuda-graph-bs 1 2 4 $(seq 16 8 256)
   --custom-config-path examples/demo/conf.yaml
   --made-up-flag 7
)

ray job submit --address="http://127.0.0.1:8265" \\
   -- python3 train.py \\
   --actor-num-nodes 1 \\
   --colocate \\
   ${CKPT_ARGS[@]} \\
   ${ROLLOUT_ARGS[@]}
"""


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    """A fake checkout: upstream's layout with a `slime/` package that must never be copied."""
    root = tmp_path / "checkout"
    (root / "slime").mkdir(parents=True)
    (root / "slime" / "__init__.py").write_text("raise ImportError('upstream slime must not be imported')\n")
    (root / "examples" / "search-r1").mkdir(parents=True)
    (root / "examples" / "search-r1" / "generate_with_search.py").write_text("")
    (root / "examples" / "demo").mkdir()
    (root / "examples" / "demo" / "run.sh").write_text(SCRIPT)
    (root / "examples" / "demo" / "conf.yaml").write_text("demo_key: 1\n")
    (root / "tests" / "plugin_contracts").mkdir(parents=True)
    (root / "tests" / "plugin_contracts" / "_shared.py").write_text("")
    (root / "tests" / "other").mkdir()
    return root


def test_launch_flags_reads_arrays_and_the_train_line_but_not_comments(upstream):
    flags = dict(harness.launch_flags(upstream / "examples" / "demo" / "run.sh"))
    assert flags["--hf-checkpoint"] == ["/root/Qwen3-4B"]
    assert flags["--rollout-batch-size"] == ["32"]
    assert flags["--apply-chat-template"] == [] and flags["--colocate"] == []
    assert flags["--actor-num-nodes"] == ["1"]
    assert "--load" not in flags  # commented out
    assert "--address" not in flags  # ray's own flags, before train.py


def test_cpu_command_replaces_paths_and_sizes_and_names_what_it_leaves_out(upstream, tmp_path):
    scratch = harness.prepare_scratch(upstream, tmp_path / "work")
    target = harness.RunTarget("demo", "demo", "run.sh", True, "qa", extra=("--seed", "3"))
    known = harness.parser_flags() - {"--made-up-flag"}
    argv, dropped, refused = harness.cpu_command(target, scratch, Path("/m"), (Path("/d/t"), Path("/d/e")),
                                                 tmp_path / "run", 2, known)
    args = argv[3:]
    value = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag.startswith("--")}
    assert value["--hf-checkpoint"] == "/m" and value["--prompt-data"] == "/d/t"
    assert value["--num-rollout"] == "2" and value["--rollout-batch-size"] == "2"
    assert value["--context-parallel-size"] == "1" and value["--seed"] == "3"
    assert value["--custom-config-path"] == str(scratch / "examples" / "demo" / "conf.yaml")
    assert "--tensor-model-parallel-size" not in args and "--sglang-cuda-graph-bs" not in args
    assert any(d.startswith("--ref-load") for d in dropped) and any("model parallelism" in d for d in dropped)
    assert refused == ["--made-up-flag"]


def test_scratch_copy_holds_examples_and_contract_tests_only(upstream, tmp_path):
    scratch = harness.prepare_scratch(upstream, tmp_path / "work")
    assert sorted(p.name for p in scratch.iterdir()) == ["examples", "tests"]
    assert [p.name for p in (scratch / "tests").iterdir()] == ["plugin_contracts"]


def test_a_folder_that_is_not_upstream_is_refused_with_what_is_missing(tmp_path):
    with pytest.raises(SystemExit, match="not a checkout of THUDM/slime.*generate_with_search.py"):
        harness.check_upstream(tmp_path)


def test_retrieval_server_speaks_search_r1s_protocol():
    with harness.RetrievalServer(port=0) as server:
        url = f"http://127.0.0.1:{server.httpd.server_address[1]}/retrieve"

        def ask(body: dict) -> dict:
            headers = {"Content-Type": "application/json"}
            request = urllib.request.Request(url, json.dumps(body).encode(), headers)
            with urllib.request.urlopen(request, timeout=10) as reply:
                return json.loads(reply.read())

        plain = ask({"queries": ["capital of France", "highest mountain"], "topk": 2, "return_scores": False})
        scored = ask({"queries": ["capital of France"], "topk": 1, "return_scores": True})
    assert [len(docs) for docs in plain["result"]] == [2, 2]
    assert plain["result"][0][0]["contents"].startswith('"Paris"\n')
    assert plain["result"][1][0]["contents"].startswith('"Mount Everest"\n')
    best = scored["result"][0][0]
    assert best["document"]["contents"].startswith('"Paris"\n') and "score" in best
    assert server.calls == 2
