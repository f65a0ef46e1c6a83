"""Upstream slime's `slime.utils` helpers on ours: misc, processing_utils and http_utils's extra names.

Real pieces throughout: a tiny real tokenizer, real PIL images, a real HTTP server on 127.0.0.1, real
sockets and subprocesses. `ray` / `transformers` are replaced only where upstream's own contract tests
replace them, to show the modules import under those stand-ins.
"""

from __future__ import annotations

import asyncio
import base64
import io
import ipaddress
import json
import multiprocessing
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
from argparse import Namespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from slime.models.tiny import build_tiny_model
from slime.utils import http_utils, misc, processing_utils
from slime.utils.misc import PluginLoadError, SingletonMeta, load_function

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ load_function


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path for plugin modules (named h2_*) written by the test; unloaded afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [name for name in sys.modules if name.startswith("h2_")]:
        del sys.modules[name]
    load_function.cache_clear()


def write_plugin(folder: Path, name: str, source: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))


def test_load_function_returns_the_named_object_and_caches_it():
    assert load_function("os.path.join") is __import__("os").path.join
    hits = load_function.cache_info().hits
    load_function("os.path.join")
    assert load_function.cache_info().hits == hits + 1


def test_a_failed_load_is_not_cached(plugin_dir: Path):
    with pytest.raises(PluginLoadError, match="on sys.path"):
        load_function("h2_later_plugin.reward")
    write_plugin(plugin_dir, "h2_later_plugin", "def reward(args, sample):\n    return 1.0\n")

    assert load_function("h2_later_plugin.reward")(None, None) == 1.0


@pytest.mark.parametrize("path", ["reward", ".reward", "h2_mod.", ""])
def test_a_path_without_module_and_name_says_how_to_write_it(path: str):
    with pytest.raises(PluginLoadError, match=r"must look like 'package\.module\.name'"):
        load_function(path)


def test_a_non_string_path_is_refused():
    with pytest.raises(PluginLoadError, match="must be a string"):
        load_function(42)


def test_a_module_not_on_sys_path_says_to_fix_pythonpath():
    with pytest.raises(PluginLoadError) as info:
        load_function("h2_nowhere_pkg.generate.generate")
    message = str(info.value)
    assert "'h2_nowhere_pkg.generate' not found" in message and "PYTHONPATH" in message
    assert "install" not in message


def test_a_misspelled_module_in_a_real_package_names_the_package():
    with pytest.raises(PluginLoadError, match=r"package 'json' exists but has no module 'json\.decodr'"):
        load_function("json.decodr.JSONDecoder")


def test_a_missing_dependency_says_install_it(plugin_dir: Path):
    write_plugin(plugin_dir, "h2_needs_dep", "import h2_not_installed_dep\n\ndef fn():\n    pass\n")

    with pytest.raises(PluginLoadError) as info:
        load_function("h2_needs_dep.fn")
    message = str(info.value)
    assert "'h2_needs_dep' imports 'h2_not_installed_dep', which is not installed" in message
    assert "install the package that provides 'h2_not_installed_dep'" in message


def test_a_plugin_for_another_slime_version_says_so(plugin_dir: Path):
    write_plugin(plugin_dir, "h2_old_api", "from slime.utils.h2_no_such_helper import thing\n")

    with pytest.raises(PluginLoadError, match=r"installed package 'slime\.utils' has no such module; "
                                              r"the plugin was written for another version of 'slime'"):
        load_function("h2_old_api.thing")


@pytest.mark.parametrize(
    ("source", "raised"),
    [("raise RuntimeError('reward server address unset')\n", "RuntimeError: reward server address unset"),
     ("def broken(:\n", "SyntaxError"),
     ("from json import no_such_name\n", "ImportError: cannot import name 'no_such_name'"),
     ("raise ModuleNotFoundError('set H2_BACKEND first')\n", "ModuleNotFoundError: set H2_BACKEND first")],
)
def test_a_module_that_fails_to_import_shows_its_error(plugin_dir: Path, source: str, raised: str):
    write_plugin(plugin_dir, "h2_broken", source)

    with pytest.raises(PluginLoadError) as info:
        load_function("h2_broken.fn")
    message = str(info.value)
    assert "module 'h2_broken' was found but importing it raised " + raised in message
    assert "not installed" not in message and info.value.__cause__ is not None


def test_a_missing_attribute_names_the_file_and_close_names():
    with pytest.raises(PluginLoadError) as info:
        load_function("os.path.joinn")
    message = str(info.value)
    assert "module 'posixpath'" in message and "has no attribute 'joinn' (did you mean 'join'" in message
    assert isinstance(info.value, ImportError)


# ------------------------------------------------------------------------------------ other misc helpers


class _Counted(metaclass=SingletonMeta):
    built = 0

    def __init__(self, value: int = 0):
        type(self).built += 1
        self.value = value


class _CountedChild(_Counted):
    pass


class _Other(metaclass=SingletonMeta):
    pass


def test_singleton_builds_once_and_clear_instances_forgets_it():
    _Counted.clear_instances()
    first = _Counted(1)
    assert _Counted(2) is first and first.value == 1
    child, other = _CountedChild(3), _Other()
    assert child is not first and _CountedChild() is child

    _Counted.clear_instances()  # forgets _Counted and its subclass, not unrelated singletons

    assert _Counted(4).value == 4 and _CountedChild(5).value == 5 and _Other() is other


def test_singleton_is_built_once_under_concurrent_first_calls():
    class Slow(metaclass=SingletonMeta):
        built = 0

        def __init__(self):
            time.sleep(0.05)
            Slow.built += 1

    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(Slow())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert Slow.built == 1 and len({id(x) for x in got}) == 1


def test_box_holds_its_value():
    ref = object()
    assert misc.Box(ref).inner is ref


def test_group_by_groups_unsorted_items_in_first_seen_order():
    words = ["apple", "bob", "avocado", "cat", "banana"]

    assert misc.group_by(words, key=lambda w: w[0]) == {
        "a": ["apple", "avocado"], "b": ["bob", "banana"], "c": ["cat"]}
    assert list(misc.group_by(words, key=len)) == [5, 3, 7, 6]
    assert misc.group_by([1, 0, 1]) == {1: [1, 1], 0: [0]}


@pytest.mark.parametrize(
    ("rollout_id", "interval", "per_epoch", "num_rollout", "expected"),
    [(0, None, None, 1, False),  # no interval: never, not even at the end
     (4, 5, None, None, True), (5, 5, None, None, False), (9, 5, None, None, True),
     (2, 5, None, 3, True),  # the last rollout
     (2, 5, 3, None, True), (3, 5, 3, None, False),  # an epoch boundary
     (0, 1, None, None, True)],
)
def test_should_run_periodic_action(rollout_id, interval, per_epoch, num_rollout, expected):
    assert misc.should_run_periodic_action(rollout_id, interval, per_epoch, num_rollout) is expected


def test_chunks_close_before_reaching_the_size():
    named = [(f"w{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 100, 1])]

    chunks = list(misc.chunk_named_params_by_size(named, chunk_size=80))  # bytes: 40 40 120 20 400 4

    assert [[name for name, _ in chunk] for chunk in chunks] == [["w0"], ["w1"], ["w2"], ["w3"], ["w4"], ["w5"]]
    chunks = list(misc.chunk_named_params_by_size(named, chunk_size=200))
    assert [[name for name, _ in chunk] for chunk in chunks] == [["w0", "w1"], ["w2", "w3"], ["w4"], ["w5"]]
    assert list(misc.chunk_named_params_by_size([], 10)) == []
    with pytest.raises(ValueError, match="positive number of bytes"):
        list(misc.chunk_named_params_by_size(named, 0))


def test_decode_int32_meta_array_takes_every_engine_form():
    values = np.array([3, -1, 70000], dtype=np.int32)
    frozen = values.copy()
    frozen.flags.writeable = False
    encoded = base64.b64encode(values.tobytes()).decode()
    forms = [encoded, values.tobytes(), [3, -1, 70000], frozen, torch.tensor([[3, -1], [70000, 0]])[:, :].flatten()[:3]]

    for form in forms:
        got = misc.decode_int32_meta_array({"routed_experts": form}, "routed_experts")
        assert got.dtype == torch.int32 and got.tolist() == [3, -1, 70000]
    assert misc.decode_int32_meta_array({"b": [1], "a": [2]}, ("a", "b")).tolist() == [2]
    assert misc.decode_int32_meta_array({"x": [1]}, ("a", "b")) is None
    assert misc.decode_int32_meta_array({"a": None}, "a") is None
    assert misc.decode_int32_meta_array({"a": b""}, "a").tolist() == []
    with pytest.raises(ValueError, match="5 bytes, not a whole number of int32"):
        misc.decode_int32_meta_array({"a": b"\x00" * 5}, "a")


def test_exec_command_runs_bash_and_returns_captured_output(capfd: pytest.CaptureFixture):
    assert misc.exec_command("x=4; echo $((x * 2)); [[ -n $x ]] && echo ok", capture_output=True) == "8\nok\n"
    assert misc.exec_command("true") is None
    assert "EXEC: true" in capfd.readouterr().out
    with pytest.raises(subprocess.CalledProcessError) as info:
        misc.exec_command("echo nope >&2; exit 3", capture_output=True)
    assert info.value.returncode == 3 and "nope" in capfd.readouterr().out


def test_get_current_node_ip_asks_ray_and_strips_ipv6_brackets(monkeypatch: pytest.MonkeyPatch):
    stand_in = types.ModuleType("ray")
    stand_in._private = types.SimpleNamespace(services=types.SimpleNamespace(get_node_ip_address=lambda: "[fd00::7]"))
    monkeypatch.setitem(sys.modules, "ray", stand_in)

    assert misc.get_current_node_ip() == "fd00::7"


def _listen(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("", port))
    sock.listen()
    return sock


def test_get_free_port_skips_busy_ports_and_finds_a_consecutive_run():
    base = misc.get_free_port(30000 + misc.free_port() % 20000, consecutive=4)
    busy = _listen(base + 1)
    try:
        assert misc.get_free_port(base) == base
        assert misc.get_free_port(base + 1) >= base + 2
        run_start = misc.get_free_port(base, consecutive=2)
        assert run_start >= base + 2
        assert http_utils.is_port_available(run_start) and http_utils.is_port_available(run_start + 1)
    finally:
        busy.close()
    with pytest.raises(RuntimeError, match="consecutive free TCP ports"):
        misc.get_free_port(65535, consecutive=2)


IMPORT_CHECK = """
import sys, types
{stubs}
import slime.utils.misc as misc
import slime.utils.processing_utils as pu
heavy = sorted(m for m in ("ray", "torch", "aiohttp", "transformers") if m in sys.modules and not {stubbed})
assert not heavy, heavy
assert misc.load_function("slime.utils.misc.group_by") is misc.group_by
print("ok")
"""

# What upstream's plugin_contracts/_shared.py puts in sys.modules, written here in our own code.
STUBS = """
ray = types.ModuleType("ray")
ray._private = types.SimpleNamespace(services=types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"))
sys.modules["ray"] = ray
tf = types.ModuleType("transformers")
tf.AutoTokenizer = type("AutoTokenizer", (), {"from_pretrained": staticmethod(lambda *a, **k: "tok")})
def _no_processor(*a, **k):
    raise OSError("stand-in")
tf.AutoProcessor = type("AutoProcessor", (), {"from_pretrained": staticmethod(_no_processor)})
tf.PreTrainedTokenizerBase = type("PreTrainedTokenizerBase", (), {})
tf.ProcessorMixin = type("ProcessorMixin", (), {})
sys.modules["transformers"] = tf
"""


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_misc_imports_nothing_heavy():
    done = _run_python(IMPORT_CHECK.format(stubs="", stubbed="False"))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_misc_and_processing_utils_work_with_upstreams_stand_ins():
    code = IMPORT_CHECK.format(stubs=STUBS, stubbed="True") + textwrap.dedent("""
        assert misc.get_current_node_ip() == "127.0.0.1"
        assert pu.load_tokenizer("any/model") == "tok"
        assert pu.load_processor("any/model") is None
        print("stand-ins ok")
    """)
    done = _run_python(code)
    assert done.returncode == 0 and done.stdout.split() == ["ok", "stand-ins", "ok"], done.stderr


# ------------------------------------------------------------------------------------- processing_utils


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("upstream-utils") / "tiny", seed=0)


def test_load_tokenizer_loads_the_real_tokenizer(tiny_dir: Path):
    tokenizer = processing_utils.load_tokenizer(str(tiny_dir), trust_remote_code=True)

    ids = tokenizer("the answer is 42")["input_ids"]
    assert ids and tokenizer.decode(ids) == "the answer is 42"
    assert "<|im_start|>" in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_load_processor_is_none_for_a_text_only_model(tiny_dir: Path):
    assert processing_utils.load_processor(str(tiny_dir)) is None


def test_load_processor_returns_a_real_processor(tiny_dir: Path, tmp_path: Path):
    from transformers import CLIPImageProcessor, LlavaProcessor, ProcessorMixin

    tokenizer = processing_utils.load_tokenizer(str(tiny_dir))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=16).save_pretrained(tmp_path)

    processor = processing_utils.load_processor(str(tmp_path))

    assert isinstance(processor, ProcessorMixin)
    out = processor(text="<image> what is it", images=[Image.new("RGB", (40, 40), "red")],
                    **processing_utils.build_processor_kwargs())
    assert isinstance(out["input_ids"], list) and tuple(out["pixel_values"].shape)[-2:] == (32, 32)


def test_a_multimodal_folder_without_a_loadable_processor_is_refused(tiny_dir: Path, tmp_path: Path):
    for item in tiny_dir.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "H2NoSuchImageProcessor", "processor_class": "H2NoSuchProcessor"}))

    with pytest.raises(NotImplementedError, match="preprocessor_config.json .*could not build its processor"):
        processing_utils.load_processor(str(tmp_path))


def test_build_processor_kwargs_keeps_inputs_and_forces_return_types():
    given = {"images": ["img"], "text_kwargs": {"padding": True, "return_tensors": "pt"},
             "images_kwargs": {"do_resize": False}}

    kwargs = processing_utils.build_processor_kwargs(given)

    assert kwargs == {
        "images": ["img"],
        "text_kwargs": {"padding": True, "return_tensors": None, "return_mm_token_type_ids": False},
        "images_kwargs": {"do_resize": False, "return_tensors": "pt"},
        "audio_kwargs": {"return_tensors": "pt"},
        "videos_kwargs": {"return_tensors": "pt"},
    }
    assert given["images_kwargs"] == {"do_resize": False}  # the caller's dict is left alone
    assert processing_utils.build_processor_kwargs(None)["text_kwargs"]["return_tensors"] is None


def _decode_data_uri(uri: str) -> Image.Image:
    head, _, data = uri.partition(",")
    assert head == "data:image/png;base64"
    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_encode_image_for_rollout_engine_sends_rgb_png():
    image = Image.new("RGBA", (3, 2), (10, 20, 30, 128))

    decoded = _decode_data_uri(processing_utils.encode_image_for_rollout_engine(image))

    assert decoded.format == "PNG" and decoded.mode == "RGB" and decoded.size == (3, 2)
    assert decoded.getpixel((0, 0)) == (10, 20, 30)
    with pytest.raises(TypeError, match="expected a PIL image"):
        processing_utils.encode_image_for_rollout_engine("photo.png")


@pytest.mark.skipif(find_spec("qwen_vl_utils") is not None, reason="qwen_vl_utils installed: its own path runs")
def test_process_vision_info_opens_every_image_form(tmp_path: Path):
    colours = ["red", "green", "blue", "white"]
    images = [Image.new("RGB", (4, 4), c) for c in colours]
    path = tmp_path / "blue.png"
    images[2].save(path)
    buffer = io.BytesIO()
    images[3].save(buffer, format="PNG")
    messages = [
        {"role": "system", "content": "plain text content is skipped"},
        {"role": "user", "content": [
            {"type": "image", "image": images[0]},
            {"type": "text", "text": "compare"},
            {"type": "image", "image": processing_utils.encode_image_for_rollout_engine(images[1])},
            {"type": "image", "image": str(path)},
            {"type": "image", "image": base64.b64encode(buffer.getvalue()).decode()},
        ]},
    ]

    found = processing_utils.process_vision_info(messages, processor=None)

    assert found["videos"] is None
    assert [im.convert("RGB").getpixel((0, 0)) for im in found["images"]] == [
        Image.new("RGB", (1, 1), c).getpixel((0, 0)) for c in colours]
    assert processing_utils.process_vision_info("a text prompt", None) == {"images": None, "videos": None}
    with pytest.raises(ValueError, match="neither an existing file nor base64 image data"):
        processing_utils.process_vision_info([{"content": [{"type": "image", "image": "nope.png"}]}], None)


# --------------------------------------------------------------------------------------------- http_utils


class _Echo(BaseHTTPRequestHandler):
    """Answers every request with what it received."""

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply({"method": "GET", "path": self.path})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._reply({"method": "POST", "body": json.loads(body), "auth": self.headers.get("Authorization")})

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def echo_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_post_and_get_take_upstreams_calls(echo_server: str):
    """The forms upstream's examples use: `post(url, payload)`, retries third, `headers=`; `get(url)`."""
    async def calls() -> list:
        http_utils.init_http_client(Namespace(rollout_num_gpus=1, sglang_server_concurrency=4))
        return [
            await http_utils.post(f"{echo_server}/generate", {"text": "hi"}),
            await http_utils.post(f"{echo_server}/generate", None, 3, headers={"Authorization": "Bearer k"}),
            await http_utils.post(f"{echo_server}/generate", {"n": 1}, max_retries=2, headers=None),
            await http_utils.get(f"{echo_server}/workers"),
        ]

    plain, empty, keyword, got = asyncio.run(calls())

    assert plain == {"method": "POST", "body": {"text": "hi"}, "auth": None}
    assert empty == {"method": "POST", "body": {}, "auth": "Bearer k"}  # None posts {}, as upstream's does
    assert keyword["body"] == {"n": 1}
    assert got == {"method": "GET", "path": "/workers"}


def test_init_http_client_refuses_distributed_post():
    with pytest.raises(NotImplementedError, match="--use-distributed-post .* drop the flag"):
        http_utils.init_http_client(Namespace(use_distributed_post=True, rollout_num_gpus=1))


def test_is_port_available_sees_a_listening_socket():
    sock = _listen(0)
    port = sock.getsockname()[1]
    try:
        assert http_utils.is_port_available(port) is False
    finally:
        sock.close()
    assert http_utils.is_port_available(port) is True
    assert http_utils.is_port_available(70000) is False and http_utils.is_port_available(-1) is False


def test_find_available_port_is_free_and_above_the_base():
    for base in (3000, 4000, 65000):
        port = http_utils.find_available_port(base)
        assert http_utils.is_port_available(port) and 0 < port <= 65535
        if base < 60000:
            assert base + 100 <= port


def test_get_host_info_honours_the_override_and_the_family(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLIME_HOST_IP", "10.1.2.3")
    assert http_utils.get_host_info() == (socket.gethostname(), "10.1.2.3")

    monkeypatch.delenv("SLIME_HOST_IP")
    hostname, ip = http_utils.get_host_info()
    assert hostname == socket.gethostname() and ipaddress.ip_address(ip).version == 4

    monkeypatch.setenv("SLIME_PREFER_IPV6", "yes")
    assert ipaddress.ip_address(http_utils.get_host_info()[1]).version == 6


@pytest.mark.parametrize(
    ("fields", "expected"),
    [({"rollout_num_engines": 3, "rollout_num_gpus": 8}, 3),
     ({"rollout_num_gpus": 8, "rollout_num_gpus_per_engine": 2}, 4),
     ({"rollout_num_gpus": 1, "rollout_num_gpus_per_engine": 2}, 1),
     ({"rollout_num_gpus": 0}, 0),
     ({}, 0),
     ({"rollout_engine_urls": ["http://a", "http://b"], "rollout_num_gpus": 8}, 2)],
)
def test_get_rollout_num_engines(fields: dict, expected: int):
    assert http_utils.get_rollout_num_engines(Namespace(**fields)) == expected


def _sleep_forever(ignore_term: bool, ready) -> None:
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


@pytest.mark.parametrize("ignore_term", [False, True])
def test_terminate_process_stops_even_a_process_ignoring_sigterm(ignore_term: bool):
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    process = context.Process(target=_sleep_forever, args=(ignore_term, ready), daemon=True)
    process.start()
    assert ready.wait(10)

    http_utils.terminate_process(process, timeout=0.2)

    assert not process.is_alive()
    assert process.exitcode == (-signal.SIGKILL if ignore_term else -signal.SIGTERM)
    http_utils.terminate_process(process)  # a finished process: nothing to do
