"""The launcher's scale knobs reach slime: ASYNC picks slime.train_async, RAY_ADDRESS reaches ray.init, node
counts become slime's cluster flags. Each command is parsed by slime's own `parse_args`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from awm_grpo.launch import config as C
from awm_grpo.launch.job import child_env, runtime_config, slime_command
from slime import ray_actors
from slime.arguments import parse_args

H100 = "81559 MiB, NVIDIA H100 80GB HBM3\n" * 8


def parsed(cfg: C.ResolvedConfig, tmp_path: Path) -> tuple[list[str], argparse.Namespace]:
    """The launcher's command and what slime's parser makes of it (the runtime YAML written as a run would)."""
    runtime = tmp_path / "awm_runtime.yaml"
    runtime.write_text(yaml.safe_dump(runtime_config(cfg)))
    cmd = slime_command(cfg, runtime)
    return cmd, parse_args(cmd[3:])


def test_async_runs_slime_train_async_with_the_same_flags(tmp_path):
    sync_cmd, _ = parsed(C.resolve(None, env={}, gpus=[]), tmp_path)
    cmd, args = parsed(C.resolve(None, env={"ASYNC": "true"}, gpus=[]), tmp_path)
    assert sync_cmd[1:3] == ["-m", "slime.train"] and cmd[1:3] == ["-m", "slime.train_async"]
    assert cmd[3:] == sync_cmd[3:]  # one recipe, two schedules
    from slime.train import Run
    from slime.train_async import AsyncRun  # the module the command names: the async schedule of the same run

    assert issubclass(AsyncRun, Run)
    assert not args.offload_train and not args.offload_rollout  # what AsyncRun requires


def test_async_on_gpus_gives_the_engines_their_own_gpus_and_refuses_colocate():
    gpus = C.parse_nvidia_smi(H100)
    assert C.resolve(None, env={}, gpus=gpus)["hardware.colocate"] is True
    cfg = C.resolve(None, env={"ASYNC": "1"}, gpus=gpus)
    assert cfg["hardware.colocate"] is False
    assert (cfg["hardware.train_num_gpus"], cfg["hardware.rollout_num_gpus"]) == (4, 4)
    with pytest.raises(C.ConfigError, match="COLOCATE=false"):
        C.resolve(None, env={"ASYNC": "1", "COLOCATE": "true"}, gpus=gpus)


def test_ray_address_reaches_ray_init(tmp_path, monkeypatch):
    cfg = C.resolve(None, env={"RAY_ADDRESS": "10.1.2.3:6379"}, gpus=[])
    _, args = parsed(cfg, tmp_path)
    assert args.ray_address == "10.1.2.3:6379"
    assert child_env(cfg)["RAY_ADDRESS"] == "10.1.2.3:6379"  # Ray's own default agrees with the flag
    calls = []
    monkeypatch.setattr(ray_actors.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_actors.ray, "init", lambda **kw: calls.append(kw))
    ray_actors.init_ray(args)
    assert calls[0]["address"] == "10.1.2.3:6379" and "num_cpus" not in calls[0]


def test_without_ray_address_a_local_cluster_starts_whatever_the_shell_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # `auto` is the launcher's "not set": the profile's null
    cfg = C.resolve(None, gpus=[])
    assert cfg["hardware.ray_address"] is None
    _, args = parsed(cfg, tmp_path)
    assert "--ray-address" not in slime_command(cfg, "/tmp/rt.yaml") and args.ray_address is None
    assert "RAY_ADDRESS" not in child_env(cfg)  # else ray.init(num_cpus=...) would try to join a cluster
    calls = []
    monkeypatch.setattr(ray_actors.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_actors.ray, "init", lambda **kw: calls.append(kw))
    ray_actors.init_ray(args)
    assert calls[0].get("address") is None and calls[0]["num_cpus"] == cfg["hardware.ray_num_cpus"]


def test_node_counts_become_slimes_cluster_flags(tmp_path):
    env = {"RAY_ADDRESS": "10.1.2.3:6379", "ACTOR_NUM_NODES": "2", "TRAIN_NUM_GPUS": "8", "ROLLOUT_NUM_GPUS": "16",
           "ROLLOUT_NUM_GPUS_PER_ENGINE": "2", "ASYNC": "true"}
    cfg = C.resolve(None, env=env, gpus=C.parse_nvidia_smi(H100))
    assert not [w for w in cfg.warnings if "GPUs requested" in w]  # a cluster, not this machine, holds them
    _, args = parsed(cfg, tmp_path)
    assert (args.actor_num_nodes, args.actor_num_gpus_per_node) == (2, 8)
    assert (args.rollout_num_gpus, args.rollout_num_gpus_per_engine, args.colocate) == (16, 2, False)
    single = C.resolve(None, env={k: v for k, v in env.items() if k != "RAY_ADDRESS"}, gpus=C.parse_nvidia_smi(H100))
    assert [w for w in single.warnings if "24 GPUs requested" in w]  # one machine of 8 cannot hold them


def test_slimes_variable_name_sets_the_trainer_gpus_per_node():
    gpus = C.parse_nvidia_smi(H100)
    cfg = C.resolve(None, env={"ACTOR_NUM_GPUS_PER_NODE": "4"}, gpus=gpus)
    assert cfg["hardware.train_num_gpus"] == 4
    assert cfg.sources["hardware.train_num_gpus"] == "env ACTOR_NUM_GPUS_PER_NODE"
    same = C.resolve(None, env={"ACTOR_NUM_GPUS_PER_NODE": "4", "TRAIN_NUM_GPUS": "4"}, gpus=gpus)
    assert same.sources["hardware.train_num_gpus"] == "env TRAIN_NUM_GPUS"
    with pytest.raises(C.ConfigError, match="TRAIN_NUM_GPUS='2' and ACTOR_NUM_GPUS_PER_NODE='4'"):
        C.resolve(None, env={"ACTOR_NUM_GPUS_PER_NODE": "4", "TRAIN_NUM_GPUS": "2"}, gpus=gpus)
    assert C.parse_sets(["ACTOR_NUM_GPUS_PER_NODE=2"]) == {"hardware.train_num_gpus": "2"}
