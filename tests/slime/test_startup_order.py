"""Start-up order (issue 20): engines start and release their memory before the trainer is built, so
an SGLang engine never sizes its KV cache while the trainer fills the same GPU. Recorded on the real
Ray path (`Run.setup`, the CPU engine, the real train actor), in a subprocess as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]

SETUP = """
import asyncio, json, sys
import ray
from slime import ray_actors
from slime.arguments import parse_args
from slime.train import Run

events = []


class RecordingPool(ray_actors.EnginePool):
    async def start(self):
        events.append("engines start")
        await super().start()
        events.append("engines serving")

    async def release_memory(self):
        await super().release_memory()
        events.append("engines released memory")

    async def resume_memory(self, tags):
        await super().resume_memory(tags)
        events.append("engines resumed " + "+".join(tags))

    async def sync_weights(self, trainer, version, out_dir):
        events.append("weights synced")
        return await super().sync_weights(trainer, version, out_dir)


class RecordingTrainActor:
    @staticmethod
    def options(**opts):
        real = ray_actors.TrainActor.options(**opts)

        class Creating:
            @staticmethod
            def remote(*args):
                events.append("trainer built")
                return real.remote(*args)

        return Creating


class RecordingActors:
    init_ray, create_placement = staticmethod(ray_actors.init_ray), staticmethod(ray_actors.create_placement)
    EnginePool, TrainActor = RecordingPool, RecordingTrainActor


async def main():
    run = Run(parse_args(sys.argv[1:]))
    run.ray_actors = RecordingActors
    try:
        await run.setup()
    finally:
        await run.close()


asyncio.run(main())
ray.shutdown()
print(json.dumps(events), flush=True)
"""


@pytest.mark.slow
def test_engines_start_and_release_memory_before_the_trainer_is_built(tmp_path):
    model = build_tiny_model(tmp_path / "model")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input": "1+1="}) + "\n")
    argv = ["--hf-checkpoint", str(model), "--prompt-data", str(prompts), "--rollout-batch-size", "1",
            "--num-rollout", "1", "--offload", "--ray-num-cpus", "4"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))

    proc = subprocess.run([sys.executable, "-c", SETUP, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)

    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [
        "engines start", "engines serving", "engines released memory",  # the KV cache is sized, then freed
        "trainer built",  # only now does the trainer load its weights
        "engines resumed weights", "weights synced", "engines resumed kv_cache+cuda_graph",
    ]
