"""The Ray side of data parallelism: the driver creates rank 0 only, rank 0 starts and leads the rest.

A real local Ray cluster and two CPU train ranks over gloo in a placement group, driven exactly as
`slime.train` drives them (`train`, `save`, `load`, `export` on one actor handle).
"""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime.arguments import parse_args
from slime.models.tiny import build_tiny_model
from slime.utils.types import Sample

pytestmark = pytest.mark.slow  # a Ray cluster and three torch processes: about a minute on 2 cores


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _samples() -> list[Sample]:
    out = []
    for i in range(6):
        tokens = [5 + (7 * i + j) % 300 for j in range(4 + i)]
        out.append(Sample(index=i, group_index=i // 2, tokens=tokens, response_length=2 + i % 3))
    return out


def test_two_rank_group_trains_saves_resumes_and_exports(ray_cluster, tmp_path):
    from slime import ray_actors

    build_tiny_model(tmp_path / "model")
    args = parse_args([
        "--hf-checkpoint", str(tmp_path / "model"), "--prompt-data", "unused.jsonl", "--rollout-batch-size", "1",
        "--num-rollout", "1", "--actor-num-gpus-per-node", "2", "--lr", "1e-2", "--distributed-timeout-minutes", "1",
    ])
    placement = ray_actors.create_placement(args)
    assert len(placement.engine_bundles) == 1 and placement.engine_bundles[0] == 2  # 2 train + 1 engine bundle
    trainer = ray_actors.TrainActor.options(**placement.options(placement.train_bundle, "train")).remote(args)
    pids = ray_cluster.get(trainer.pids.remote())
    assert len(set(pids)) == 2

    samples = _samples()
    metrics = ray_cluster.get(trainer.train.remote(samples, [1.0, -1.0] * 3))
    assert metrics["train/tokens"] == sum(s.response_length for s in samples)
    assert metrics["train/grad_norm"] > 0
    path = ray_cluster.get(trainer.save.remote(str(tmp_path / "ck"), 0, {"next_rollout_id": 1}))
    exported = ray_cluster.get(trainer.export.remote(str(tmp_path / "hf")))
    after_first = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).state_dict()

    sft = ray_cluster.get(trainer.train.remote(samples, None, "sft_loss"))
    assert "train/sft_loss" in sft and "train/pg_loss" not in sft
    info = ray_cluster.get(trainer.load.remote(str(tmp_path / "ck")))
    assert info["path"] == path and info["data_state"] == {"next_rollout_id": 1}
    reloaded = ray_cluster.get(trainer.export.remote(str(tmp_path / "hf2")))
    state = AutoModelForCausalLM.from_pretrained(reloaded, dtype=torch.float32).state_dict()
    for key, value in after_first.items():
        torch.testing.assert_close(state[key], value, atol=0, rtol=0, msg=key)
    ray_cluster.get(trainer.close.remote())  # both ranks leave the gloo group together (a barrier, then destroy)
    ray_cluster.kill(trainer)
    ray_cluster.util.remove_placement_group(placement.group)
