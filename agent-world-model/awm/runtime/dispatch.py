"""How a tool call's HTTP request reaches the generated FastAPI app: directly, or over ASGI in-process.

Over ASGI a call pays for FastAPI's middleware stack, a scan of the router, a Request object,
two exit stacks and the response messages: about as much CPU as a typical AWM handler. The
direct path compiles each tool's route once and then, per call, does what FastAPI's request
handler (`fastapi.routing.get_request_handler`) does for such a route, with FastAPI's functions:

    path and query params  -> request_params_to_args        (the strings the ASGI path would see;
                                                             compiled per route: `awm.runtime.request_params`)
    JSON body              -> json.loads, request_body_to_args
    errors                 -> RequestValidationError -> the app's handler -> 422
    endpoint(**values)     -> serialize_response (the route's response field) -> response class
    HTTPException          -> the app's handler;  any other exception -> 500 "Internal Server Error"
    dependencies (Depends, yield)  -> solve_dependencies with a Request on the ASGI path's scope,
                                      between the same two exit stacks as fastapi.routing.request_response

so status and body bytes are the ASGI path's (`tests/awm/test_dispatch.py` compares both on every
tool of every bundled and excerpt scenario). The caller's containment (the call's deadline, the
episode's connection binding and rollback) wraps both paths alike.

Falls back to ASGI, decided when a route is compiled: on its first call, and again if code changed the
app's routes, middleware, exception handlers or dependency overrides since (`Dispatcher.reason` says why):
- the app: not a plain FastAPI, user middleware, any custom exception handler (incl. 500/Exception),
  dependency overrides, debug mode, a root_path, a body size limit, router middleware, native
  telemetry switched on;
- a route: not a plain APIRoute at the top of `app.router` (included routers, mounts), or behind a
  mount or other non-Route entry; header or cookie params, or Request, Response, BackgroundTasks,
  WebSocket or SecurityScopes params (the endpoint's or a dependency's); form bodies; generator
  endpoints (JSONL/SSE streams); a body size limit on the route.
And per call, before the endpoint runs: a concrete path that the route's own pattern does not match
or that an earlier route would take (a path param such as "" or "latest"), and a body that is not
valid JSON. A Response object the endpoint returns itself is used as is; one with a background
task or a streamed body is run as an ASGI response, as the ASGI path would.
"""

from __future__ import annotations

import asyncio
import json
import re
import traceback
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, params
from fastapi._compat import Undefined
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import (
    Dependant,
    _is_async_gen_callable,
    _is_coroutine_callable,
    _is_gen_callable,
)
from fastapi.dependencies.utils import request_body_to_args, solve_dependencies
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
    websocket_request_validation_exception_handler,
)
from fastapi.exceptions import FastAPIError, RequestValidationError, WebSocketRequestValidationError
from fastapi.routing import APIRoute, APIRouter, _extract_endpoint_context, serialize_response
from fastapi.utils import is_body_allowed_for_status_code
from starlette._exception_handler import _lookup_exception_handler
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from awm.runtime.deadline import CallInterrupted
from awm.runtime.request_params import ParamReader
from awm.tools import HttpRequest

Reply = tuple[int, bytes, str]  # status, body, server-side traceback ("" unless the app failed)
INTERNAL_ERROR = b"Internal Server Error"
_DEFAULT_HANDLERS = {StarletteHTTPException: http_exception_handler,
                     RequestValidationError: request_validation_exception_handler,
                     WebSocketRequestValidationError: websocket_request_validation_exception_handler}
_SPECIAL_PARAMS = ("request_param_name", "websocket_param_name", "http_connection_param_name",
                   "response_param_name", "background_tasks_param_name", "security_scopes_param_name")


def short_traceback(limit: int = 6) -> str:
    """The innermost frames of the exception being handled (for logs, never shown to the agent)."""
    return "".join(traceback.format_exc(limit=-limit))


def _server_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n{short_traceback()}"


def interrupted_reply(trace: str | None = None) -> Reply:
    """The answer to a call stopped at its soft deadline; `trace` is the log detail (default: the current one)."""
    return (500, INTERNAL_ERROR + b": the call ran past its time limit and was interrupted",
            f"CallInterrupted: ran past its soft deadline\n{short_traceback() if trace is None else trace}")


class _Exchange:
    """The client side of one in-process HTTP exchange: one request message, the response collected."""

    def __init__(self, body: bytes | None) -> None:
        self.pending = [{"type": "http.request", "body": body or b"", "more_body": False}]
        self.status, self.chunks = 500, []

    async def receive(self) -> dict[str, Any]:
        if self.pending:
            return self.pending.pop()
        await asyncio.Event().wait()  # the app asked for more: nothing will come
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))


def _scope(req: HttpRequest) -> dict[str, Any]:
    headers = [(b"host", b"apiserver")]
    if req.body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(req.body)).encode())]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": req.method,
            "scheme": "http", "path": req.path, "raw_path": req.path.encode(), "query_string": req.query_string,
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 0), "server": ("apiserver", 80)}


async def asgi_call(app: Any, req: HttpRequest) -> Reply:
    """One HTTP exchange with an ASGI app (or a Response object), in-process."""
    out = _Exchange(req.body)
    try:
        await app(_scope(req), out.receive, out.send)
    except Exception as exc:  # Starlette answers 500 and then re-raises: keep the traceback for logs
        return out.status, b"".join(out.chunks) if out.chunks else INTERNAL_ERROR, _server_error(exc)
    except CallInterrupted:
        return interrupted_reply()
    return out.status, b"".join(out.chunks), ""


def _app_version(app: Any) -> tuple[int, ...]:
    """What compiled routes depend on that code could still change at run time: a change means compiling again.
    Runs on every call, so spelled out rather than looped."""
    router = getattr(app, "router", None)
    return (len(getattr(router, "routes", None) or ()), len(getattr(app, "user_middleware", None) or ()),
            len(getattr(app, "exception_handlers", None) or ()), len(getattr(app, "dependency_overrides", None) or ()))


_NAMED_GROUP = re.compile(r"(?<!\\)\(\?P<\w+>")


def _any_of(patterns: list[re.Pattern]) -> re.Pattern | None:
    """One pattern that matches where any of `patterns` matches (one C-level match per call instead of one
    per earlier route); None when there are none. Named groups become plain groups so the names may repeat;
    patterns with flags or that do not compile together are matched one by one (`_Each`)."""
    if not patterns:
        return None
    if any(p.flags & ~re.UNICODE for p in patterns):
        return _Each(patterns)
    try:
        return re.compile("|".join(f"(?:{_NAMED_GROUP.sub('(?:', p.pattern)})" for p in patterns))
    except (re.error, TypeError):
        return _Each(patterns)


class _Each:
    """`_any_of`'s fallback: the patterns tried in turn."""

    def __init__(self, patterns: list[re.Pattern]) -> None:
        self.patterns = tuple(patterns)

    def match(self, path: str) -> bool:
        return any(p.match(path) for p in self.patterns)


def _app_reason(app: Any) -> str:
    """Why no route of `app` can be served directly ("" when routes may be)."""
    if not isinstance(app, FastAPI):
        return f"the app is a {type(app).__name__}, not a FastAPI app"
    if type(app).__call__ is not FastAPI.__call__ or type(app).build_middleware_stack is not \
            FastAPI.build_middleware_stack:
        return "the app's class overrides how requests are served"
    if app.user_middleware:
        return "the app adds middleware"
    if app.dependency_overrides:
        return "the app overrides dependencies"
    if app.exception_handlers != _DEFAULT_HANDLERS:
        return "the app installs its own exception handlers"
    if app.debug or app.root_path or getattr(app, "max_body_size", None) is not None:
        return "the app runs in debug mode, under a root_path or with a body size limit"
    router = app.router
    if type(router) is not APIRouter or router.middleware_stack != router.app:
        return "the app's router is customised or has middleware"
    telemetry = getattr(app, "_native_telemetry", None)
    if telemetry is not None and telemetry.enabled():
        return "FastAPI's native telemetry is on"
    return ""


def _dependants(dep: Dependant) -> list[Dependant]:
    """The endpoint's dependant and every sub-dependency's, depth first."""
    return [dep, *(d for sub in dep.dependencies for d in _dependants(sub))]


def _route_reason(route: APIRoute) -> str:
    """Why `route` must go over ASGI ("" when it can be served directly)."""
    cls = type(route)
    if any(getattr(cls, name) is not getattr(APIRoute, name) for name in ("get_route_handler", "matches", "handle")):
        return "the route class is customised"
    dep = route.dependant
    for part in _dependants(dep):
        if part.header_params or part.cookie_params:
            return "the route reads headers or cookies"
        if any(getattr(part, name) for name in _SPECIAL_PARAMS):
            return "the endpoint or a dependency takes a Request, Response, BackgroundTasks, WebSocket or SecurityScopes"
    if route.body_field is not None and isinstance(route.body_field.field_info, params.Form):
        return "the route reads a form body"
    if route.is_sse_stream or route.is_json_stream or _is_gen_callable(dep.call) or _is_async_gen_callable(dep.call):
        return "the endpoint streams its response"
    if getattr(route, "max_body_size", None) is not None:
        return "the route limits its body size"
    return ""


@dataclass
class DirectRoute:
    """One route compiled for direct calls: what FastAPI's request handler would read, resolved once."""

    route: APIRoute
    shadows: re.Pattern | _Each | None  # matches where an earlier route of the same method would win
    is_coroutine: bool
    response_class: type[Response]
    dump_json: bool  # FastAPI's fast path: the response field serialises straight to JSON bytes
    endpoint_ctx: dict[str, Any]
    handlers: dict[Any, Any]
    path_reader: ParamReader
    query_reader: ParamReader

    def path_params(self, path: str) -> dict[str, Any] | None:
        """The converted path params the router would hand this route, or None when it would not pick it."""
        match = self.route.path_regex.match(path)
        if match is None or (self.shadows is not None and self.shadows.match(path)):
            return None
        convertors = self.route.param_convertors
        return {k: convertors[k].convert(v) for k, v in match.groupdict().items()}

    async def call(self, req: HttpRequest) -> Reply | None:
        """Serve `req` as the ASGI path would; None (before anything ran) when only ASGI can."""
        body: Any = Undefined
        try:
            path_params = self.path_params(req.path)
            if path_params is not None and self.route.body_field is not None and req.body:
                body = json.loads(req.body)
        except Exception:  # a convertor's or FastAPI's own JSON error (json_invalid): leave it to FastAPI
            return None
        if path_params is None:
            return None
        sent: list[Reply] = []  # the response, once "sent"
        try:
            try:
                await self._request_response(path_params, req, body, sent)
            except Exception as exc:  # Starlette's wrap_app_handling_exceptions: the app's handler, if any
                handler = _lookup_exception_handler(self.handlers, exc)
                if handler is None:
                    raise
                if sent:
                    raise RuntimeError("Caught handled exception, but response already started.") from exc
                sent.append(await self._send(await handler(None, exc), req))  # default handlers read only exc
                exc.__traceback__ = None
        except Exception as exc:  # ServerErrorMiddleware: 500 unless a response had started
            return (*sent[0][:2], _server_error(exc)) if sent else (500, INTERNAL_ERROR, _server_error(exc))
        except CallInterrupted:
            return interrupted_reply()
        return sent[0]

    async def _request_response(self, path_params: dict[str, Any], req: HttpRequest, body: Any,
                                sent: list[Reply]) -> None:
        """fastapi.routing.request_response: the handler between the dependencies' exit stacks, then the send."""
        if not self.route.dependant.dependencies:
            sent.append(await self._send(await self._handle(path_params, req.query_string, body, None), req))
            return
        scope = {**_scope(req), "path_params": path_params}
        request = Request(scope, _Exchange(req.body).receive)
        response_awaited = False
        async with AsyncExitStack() as request_stack:
            scope["fastapi_inner_astack"] = request_stack
            async with AsyncExitStack() as function_stack:
                scope["fastapi_function_astack"] = function_stack
                response = await self._handle(path_params, req.query_string, body, request)
            sent.append(await self._send(response, req))
            response_awaited = True
        if not response_awaited:  # a dependency with yield swallowed the endpoint's exception
            raise FastAPIError("Response not awaited. There's a high chance that the application code is raising an "
                               "exception and a dependency with yield has a block with a bare except, or a block with "
                               "except Exception, and is not raising the exception again. Read more about it in the "
                               "docs: https://fastapi.tiangolo.com/tutorial/dependencies/dependencies-with-yield/"
                               "#dependencies-with-yield-and-except")

    @staticmethod
    async def _send(response: Response, req: HttpRequest) -> Reply:
        if type(response).__call__ is Response.__call__ and response.background is None:
            return response.status_code, bytes(response.body), ""
        return await asgi_call(response, req)  # streamed or with a background task: as the ASGI path sends it

    async def _handle(self, path_params: dict[str, Any], query_string: bytes, body: Any,
                      request: Request | None) -> Response:
        """fastapi.routing.get_request_handler's handler: arguments (with `request`: dependencies too),
        the endpoint, the response; raises what the handler would raise."""
        route, dep = self.route, self.route.dependant
        if request is None:  # no dependencies: the compiled readers
            values, errors = self.path_reader.read(path_params)
            query_values, query_errors = self.query_reader.read(QueryParams(query_string) if
                                                                self.query_reader.fields else {})
            values.update(query_values)
            errors += query_errors
            if dep.body_params:
                body_values, body_errors = await request_body_to_args(
                    body_fields=dep.body_params, received_body=body, embed_body_fields=route._embed_body_fields)
                values.update(body_values)
                errors.extend(body_errors)
        else:
            solved = await solve_dependencies(
                request=request, dependant=dep, body=body, dependency_overrides_provider=route.dependency_overrides_provider,
                async_exit_stack=request.scope["fastapi_inner_astack"], embed_body_fields=route._embed_body_fields)
            values, errors = solved.values, solved.errors
        if errors:
            raise RequestValidationError(errors, body=None if body is Undefined else body,
                                         endpoint_ctx=self.endpoint_ctx)
        # a sync endpoint runs here rather than in a thread: the worker serves one call at a time anyway
        raw = await dep.call(**values) if self.is_coroutine else dep.call(**values)
        if isinstance(raw, Response):
            return raw
        content = await serialize_response(
            field=route.response_field, response_content=raw, include=route.response_model_include,
            exclude=route.response_model_exclude, by_alias=route.response_model_by_alias,
            exclude_unset=route.response_model_exclude_unset, exclude_defaults=route.response_model_exclude_defaults,
            exclude_none=route.response_model_exclude_none, endpoint_ctx=self.endpoint_ctx, dump_json=self.dump_json)
        status = {"status_code": route.status_code} if route.status_code else {}
        if self.dump_json:
            response = Response(content=content, media_type="application/json", **status)
        else:
            response = self.response_class(content, **status)
        if not is_body_allowed_for_status_code(response.status_code):
            response.body = b""
        return response


class Dispatcher:
    """Serves one app's tool calls, directly where the route allows it, else over ASGI."""

    def __init__(self, app: Any, *, direct: bool = True) -> None:
        self.app, self.direct = app, direct
        self.routes: dict[tuple[str, str], DirectRoute | None] = {}
        self.reason: dict[tuple[str, str], str] = {}  # (method, path template) -> why it goes over ASGI
        self.calls = {"direct": 0, "asgi": 0}  # how the calls so far were served
        self.compiled_for: tuple[int, ...] = ()
        self.app_reason = ""

    def compile(self, method: str, path: str) -> DirectRoute | None:
        """The direct route for `method path` (the tool's route template), compiled on first use, and again
        when the app changed since (an added route may take the request, added middleware must run)."""
        version = _app_version(self.app)
        if version != self.compiled_for:
            self.routes.clear()
            self.reason.clear()
            self.compiled_for = version
            self.app_reason = _app_reason(self.app) if self.direct else "direct dispatch is switched off"
        key = (method, path)
        if key not in self.routes:
            self.routes[key], self.reason[key] = self._compile(method, path)
        return self.routes[key]

    def _compile(self, method: str, path: str) -> tuple[DirectRoute | None, str]:
        if self.app_reason:
            return None, self.app_reason
        shadows = []
        for route in self.app.router.routes:
            if isinstance(route, WebSocketRoute):
                continue  # never matches an HTTP request
            if not isinstance(route, Route):
                return None, f"the route comes after a {type(route).__name__} (a mount or included router)"
            if isinstance(route, APIRoute) and route.path_format == path and method in route.methods:
                reason = _route_reason(route)
                if reason:
                    return None, reason
                response_class = route.response_class
                default_class = isinstance(response_class, DefaultPlaceholder)
                ctx = dict(_extract_endpoint_context(route.dependant.call))
                ctx["path"] = f"{method} {route.dependant.path}"  # as FastAPI's handler labels it (root_path is "")
                return DirectRoute(route, _any_of(shadows), _is_coroutine_callable(route.dependant.call),
                                   response_class.value if default_class else response_class,
                                   default_class and route.response_field is not None, ctx,
                                   self.app.exception_handlers, ParamReader(route.dependant.path_params),
                                   ParamReader(route.dependant.query_params)), ""
            if type(route).matches not in (Route.matches, APIRoute.matches):
                return None, "an earlier route matches requests in its own way"
            if route.methods is None or method in route.methods:
                shadows.append(route.path_regex)
        return None, "no top-level route of the app serves it (an included router?)"

    async def call(self, req: HttpRequest, route_path: str) -> Reply:
        """Serve `req`, a request for the route `route_path` (the tool's path template)."""
        direct = self.compile(req.method, route_path)
        reply = await direct.call(req) if direct is not None else None
        if reply is not None:
            self.calls["direct"] += 1
            return reply
        self.calls["asgi"] += 1
        return await asgi_call(self.app, req)
