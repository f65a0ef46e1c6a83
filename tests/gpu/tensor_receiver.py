"""An engine's receiving side of `POST /update_weights_from_tensor`, for the device check (no SGLang there).

    python tests/gpu/tensor_receiver.py        # prints "listening on http://127.0.0.1:PORT", serves until killed

A stdlib HTTP server in its own process that answers the routes `TensorWeightSync` calls (the pause, flush,
weight-update session and version routes, under sglang 0.5.23's version so the session is used) and loads
each bucket the way SGLang's flattened-bucket loader does: base64, unpickle the `ForkingPickler` dump (a
CUDA IPC handle on a GPU, a shared-memory handle by file name on the CPU), cut the flat uint8 tensor into
the named tensors and copy each into the weights this process holds. It is a stand-in for SGLang's HTTP
layer and model, not for the handles: those are torch's own, opened in another process as an engine would.
The sender is trusted here (this is a measurement harness): unlike the CPU engine, it unpickles with
torch's rebuilds unrestricted. `GET /checksums` gives each weight's exact checksum (`checksum` below).
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from slime.engine.tensor_payload import SGLANG_METADATA, TensorMetadata, named_tensors  # noqa: E402


def checksum(tensor: torch.Tensor) -> list[int]:
    """Two exact integers over a tensor's bits: their plain sum and a position-weighted sum (equal for
    bit-equal tensors, computed where the tensor lives: no copy of gigabytes to the host)."""
    bits = tensor.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 65521 + 1
    return [int(bits.sum()), int((bits * weights).sum())]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == SGLANG_METADATA:  # sglang's metadata class, read into ours (no sglang here)
            return TensorMetadata
        return super().find_class(module, name)


class Engine:
    """The weights held, the version served, and what arrived."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.version = "0"
        self.posts = 0
        self.load_s = 0.0
        self.lock = threading.Lock()

    def load(self, body: dict[str, Any]) -> None:
        started = time.perf_counter()
        for text in body["serialized_named_tensors"]:
            obj = _Unpickler(io.BytesIO(base64.b64decode(text))).load()
            for name, tensor in named_tensors(obj["flattened_tensor"], obj["metadata"]):
                held = self.weights.get(name)
                if held is None:
                    self.weights[name] = tensor.clone()
                else:
                    held.copy_(tensor)
            del obj
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # copied before the sender frees the bucket
        self.posts += 1
        self.load_s += time.perf_counter() - started
        self.version = str(body.get("weight_version") or self.version)


ENGINE = Engine()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, obj: Any, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path in ("/health", "/server_info"):
            self._reply({"version": "0.5.23"})
        elif self.path == "/model_info":
            self._reply({"weight_version": ENGINE.version})
        elif self.path == "/checksums":
            with ENGINE.lock:
                self._reply({"posts": ENGINE.posts, "load_s": ENGINE.load_s,
                             "checksums": {k: checksum(v) for k, v in ENGINE.weights.items()},
                             "bytes_held": sum(v.numel() * v.element_size() for v in ENGINE.weights.values()),
                             "dtypes": sorted({str(v.dtype).removeprefix("torch.") for v in ENGINE.weights.values()})})
        else:
            self._reply({"error": f"no route GET {self.path}"}, 404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/update_weights_from_tensor":
            try:
                with ENGINE.lock:
                    ENGINE.load(body)
            except Exception as exc:  # the sender sees why
                self._reply({"success": False, "message": f"{type(exc).__name__}: {exc}"}, 400)
                return
            self._reply({"success": True, "message": "loaded"})
        elif self.path in ("/pause_generation", "/continue_generation", "/flush_cache", "/begin_weight_update",
                           "/end_weight_update"):
            self._reply({"success": True})
        else:
            self._reply({"error": f"no route POST {self.path}"}, 404)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
