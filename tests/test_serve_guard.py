"""``lmforge serve`` against a hostile or careless client, over real sockets: numbers out of range, unexpected
exceptions, clients that leave, foreign Host and Origin headers, bodies without a Content-Type, SIGTERM, a
served folder replaced on disk, the API key, and every ``curl`` example of ``serve --help`` and docs/serve.md
run with real curl."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from test_serve_openai import build_folders, free_port, openai_entries, serve_process, uvicorn_thread
from test_transfer_families import tiny_gpt

import lmforge
from lmforge.cli import main
from lmforge.generation import generate_text
from lmforge.serve import ServeLimits, create_app

ROOT = Path(__file__).resolve().parents[1]
KEY = "guard-key-0123456789"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, wordpiece_tokenizer, bpe_tokenizer) -> dict[str, Path]:
    return build_folders(tmp_path_factory.mktemp("serve-guard"), wordpiece_tokenizer, bpe_tokenizer)


# -- raw HTTP/1.1 over one socket: what a keep-alive client sees ----------------------------------------------------
def http_bytes(method: str, path: str, body: bytes | None = None, headers: dict | None = None,
               host: str = "127.0.0.1") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def exchange(port: int, requests: list[bytes]) -> list[tuple[int, dict, bytes]]:
    """Send the requests one after the other on ONE connection; (status, headers, body) of each answer."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s, s.makefile("rb") as f:
        for req in requests:
            s.sendall(req)
            status_line = f.readline()
            if not status_line:
                raise ConnectionError(f"the server closed the connection before answering request {len(out) + 1}")
            headers = {}
            while (line := f.readline()) not in (b"\r\n", b""):
                k, v = line.decode("latin-1").split(":", 1)
                headers[k.strip().lower()] = v.strip()
            out.append((int(status_line.split()[1]), headers, f.read(int(headers.get("content-length", "0")))))
    return out


def one_line_json_error(status: int, headers: dict, body: bytes, lo: int = 400, hi: int = 599) -> str:
    assert lo <= status <= hi, (status, body)
    assert headers["content-type"].startswith("application/json"), (headers, body)
    err = json.loads(body)["error"]
    msg = err["message"] if isinstance(err, dict) else err
    assert msg and "\n" not in msg and "Traceback" not in msg
    return msg


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


# -- issue 35: numbers, exceptions, clients that leave (each failed before the fix, as noted) -----------------------
def test_big_seed_and_nan_temperature_are_4xx_and_the_connection_stays_usable(folders):
    """Before: "seed": 2**80 answered a plain-text 500 and the next request on the connection was reset;
    a NaN temperature was answered "must be >= 0"."""
    app = create_app(openai_entries(folders), ServeLimits(max_new_tokens=16))
    gen = {"content-type": "application/json"}
    bodies = [
        ("/v1/generate", json.dumps({"model": "gpt", "prompt": "hi", "max_new_tokens": 4, "seed": 2**80}).encode()),
        ("/v1/generate", b'{"model": "gpt", "prompt": "hi", "max_new_tokens": 4, "temperature": NaN}'),
        ("/v1/completions", json.dumps({"model": "gpt", "prompt": "hi", "max_tokens": 4, "seed": -1}).encode()),
        ("/v1/fill-mask", b'{"model": "bert", "text": "a [MASK]", "top_k": 1e400}'),
        ("/v1/projection", json.dumps({"model": "bert", "texts": ["a", "a"], "word": "a", "layer": 2**80}).encode()),
    ]
    with uvicorn_thread(app) as base:
        requests = [http_bytes("POST", p, b, gen) for p, b in bodies] + [http_bytes("GET", "/health")]
        answers = exchange(port_of(base), requests)
    assert "seed" in one_line_json_error(*answers[0], hi=499)
    assert "finite" in one_line_json_error(*answers[1], hi=499)
    assert "seed" in one_line_json_error(*answers[2], hi=499)
    assert "top_k" in one_line_json_error(*answers[3], hi=499)
    assert "layer" in one_line_json_error(*answers[4], hi=499)
    assert answers[5][0] == 200 and json.loads(answers[5][2])["status"] == "ok"


def test_a_vanishing_temperature_or_top_p_is_answered_with_the_greedy_text(folders):
    """Before: a temperature or top_p of 1e-300 passed the range checks and ended in a JSON 500 (torch's sampler
    got NaN probabilities); the limit of sampling as either falls is the greedy choice."""
    app = create_app(openai_entries(folders), ServeLimits(max_new_tokens=16))
    base_body = {"model": "gpt", "prompt": "hi", "max_new_tokens": 4, "seed": 0}
    with uvicorn_thread(app) as base:
        greedy = httpx.post(f"{base}/v1/generate", json=base_body)
        assert greedy.status_code == 200, greedy.text
        for extra in ({"temperature": 1e-300}, {"temperature": 1.0, "top_p": 1e-300}):
            r = httpx.post(f"{base}/v1/generate", json={**base_body, **extra})
            assert r.status_code == 200 and r.json()["text"] == greedy.json()["text"], (extra, r.text)
        r = httpx.post(f"{base}/v1/completions", json={"model": "gpt", "prompt": "hi", "max_tokens": 4,
                                                       "temperature": 1e-300})
        assert r.status_code == 200, r.text


def test_an_unexpected_exception_is_a_json_500_and_the_connection_stays_usable(folders):
    """Before: a plain-text "Internal Server Error" and the connection closed under the next request."""
    entries = openai_entries(folders)

    def broken(*args, **kwargs):
        raise RuntimeError("index out of range in self\n  (second line of a torch message)")

    entries["bert"].obj.fill_mask = broken
    entries["bert"].obj.embed = broken
    app = create_app(entries)
    gen = {"content-type": "application/json"}
    with uvicorn_thread(app) as base:
        answers = exchange(port_of(base), [
            http_bytes("POST", "/v1/fill-mask", b'{"model": "bert", "text": "a [MASK] ."}', gen),
            http_bytes("POST", "/v1/embeddings", b'{"model": "bert", "input": "a b"}', gen),
            http_bytes("GET", "/health"),
        ])
    assert "internal error" in one_line_json_error(*answers[0], lo=500)
    assert json.loads(answers[1][2])["error"]["type"] == "server_error" and answers[1][0] == 500
    assert answers[2][0] == 200


def _slow(model, seconds: float):
    """Make every forward pass of ``model``'s body take ``seconds`` longer (a long generation on a tiny model)."""
    body = model.body

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return body(*args, **kwargs)

    model.body = slow


@pytest.mark.parametrize("path,body", [
    ("/v1/generate", {"model": "gpt", "prompt": "The python", "max_new_tokens": 4000}),
    # greedy, as /v1/generate: a sample (OpenAI's default temperature 1) may end the text early at an end token
    ("/v1/completions", {"model": "gpt", "prompt": "The python", "max_tokens": 4000, "temperature": 0}),
])
def test_a_generation_whose_client_left_frees_its_slot(folders, path, body):
    """Before: two requests whose sockets closed after 1 s kept generations_running at 2 (429 for everyone)
    for the whole generation (here 4000 x 5 ms = 20 s)."""
    entries = openai_entries(folders)
    _slow(entries["gpt"].obj, 0.005)
    app = create_app(entries, ServeLimits(max_new_tokens=4096, max_generations=2))
    with uvicorn_thread(app) as base:
        outcomes: list = []

        def leave():
            try:
                outcomes.append(httpx.post(base + path, json=body, timeout=1.0).status_code)
            except httpx.TimeoutException:  # the client gives up after 1 s and closes its socket
                outcomes.append("left")

        clients = [threading.Thread(target=leave) for _ in range(2)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        assert outcomes == ["left", "left"]
        deadline = time.monotonic() + 5
        while httpx.get(base + "/health").json()["generations_running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(base + "/health").json()["generations_running"] == 0
        r = httpx.post(base + "/v1/generate", json={"model": "gpt", "prompt": "hi", "max_new_tokens": 2}, timeout=30)
        assert r.status_code == 200


@pytest.fixture(scope="module")
def env_key_server(folders):
    """`lmforge serve` on loopback with its key from LMFORGE_API_KEY; yields (base URL, process)."""
    with serve_process([folders["gpt"]], env={"LMFORGE_API_KEY": KEY}) as served:
        yield served


@pytest.mark.parametrize("path,body", [
    ("/v1/generate", {"model": "gpt", "prompt": "The python", "max_new_tokens": 4000, "stream": True}),
    ("/v1/completions", {"model": "gpt", "prompt": "The python", "max_tokens": 4000, "stream": True, "temperature": 0}),
])
def test_a_stream_whose_client_left_frees_its_slot(folders, path, body):
    entries = openai_entries(folders)
    _slow(entries["gpt"].obj, 0.005)
    app = create_app(entries, ServeLimits(max_new_tokens=4096, max_generations=1))
    with uvicorn_thread(app) as base:
        with httpx.stream("POST", base + path, json=body, timeout=30) as r:
            lines = r.iter_lines()  # kept: dropping the iterator would close the response
            assert next(lines).startswith("data: ")
            assert httpx.get(base + "/health").json()["generations_running"] == 1
        deadline = time.monotonic() + 5  # the client read one event and closed its socket
        while httpx.get(base + "/health").json()["generations_running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(base + "/health").json()["generations_running"] == 0


def test_host_header_is_checked_against_the_bound_address(env_key_server):
    """Before: a server on 127.0.0.1 answered ``Host: evil.example.com`` (DNS rebinding)."""
    port = port_of(env_key_server[0])
    auth = {"Authorization": f"Bearer {KEY}"}
    answers = exchange(port, [
        http_bytes("GET", "/v1/models", headers=auth, host="evil.example.com"),
        http_bytes("GET", "/v1/models", headers=auth, host=f"evil.example.com:{port}"),
        http_bytes("GET", "/", headers=auth, host=f"localhost:{port}"),
        http_bytes("GET", "/v1/models", headers=auth, host=f"127.0.0.1:{port}"),
        http_bytes("GET", "/v1/models", headers=auth, host=f"[::1]:{port}"),
        http_bytes("GET", "/health", host="localhost"),
    ])
    assert "evil.example.com" in one_line_json_error(*answers[0], lo=421, hi=421)
    assert "--allowed-host" in one_line_json_error(*answers[1], lo=421, hi=421)
    assert [a[0] for a in answers[2:]] == [200, 200, 200, 200]


def test_sigterm_shuts_down_cleanly_with_exit_0(folders):
    """Before: exit 143.  A generation in flight is finished or cancelled, its client gets a JSON answer."""
    with serve_process([folders["gpt"], "--max-new-tokens", "4096"]) as (base, proc):
        answer: list = []

        def long_generation():
            answer.append(httpx.post(base + "/v1/generate", timeout=60,
                                     json={"model": "gpt", "prompt": "The python", "max_new_tokens": 4096}))

        t = threading.Thread(target=long_generation)
        t.start()
        deadline = time.monotonic() + 10
        while httpx.get(base + "/health").json()["generations_running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=40)
        t.join(timeout=10)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and out.rstrip().endswith("lmforge serve: stopped")
    assert len(answer) == 1, "the client in flight got no answer"
    assert (answer[0].status_code, "text" if answer[0].status_code == 200 else "error") in (
        (200, "text"), (503, "error")) and ("text" if answer[0].status_code == 200 else "error") in answer[0].json()


def test_a_folder_replaced_on_disk_is_reloaded(folders, bpe_tokenizer, tmp_path):
    """Before: the server kept answering from the model that `finetune --overwrite` / a re-save replaced."""
    served = tmp_path / "gpt"
    shutil.copytree(folders["gpt"], served)
    new = tiny_gpt(bpe_tokenizer, seed=1)
    want_old = generate_text(lmforge.load(served), "The python", max_new_tokens=10)
    want_new = generate_text(new, "The python", max_new_tokens=10)
    assert want_old != want_new
    body = {"model": "gpt", "prompt": "The python", "max_new_tokens": 10}
    with serve_process([served]) as (base, proc):
        assert httpx.post(base + "/v1/generate", json=body).json()["text"] == want_old
        staged = tmp_path / ".gpt.staged"
        new.save_pretrained(staged, bpe_tokenizer)
        served.rename(tmp_path / ".gpt.old")  # what a staged replace does: two renames
        staged.rename(served)
        shutil.rmtree(tmp_path / ".gpt.old")
        assert httpx.post(base + "/v1/generate", json=body).json()["text"] == want_new
        models = httpx.get(base + "/v1/models").json()["data"]
        assert models[0]["id"] == "gpt" and models[0]["reloads"] == 1
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert re.search(r"reloaded 'gpt'.*changed on disk", err), err


# -- api key, allowed hosts, origins, content types -------------------------------------------------------------
def test_api_key_allowed_host_and_origin_from_the_cli(folders):
    args = [folders["gpt"], folders["bert"], "--api-key", KEY, "--allowed-host", "lmforge.test",
            "--allow-origin", "https://app.example"]
    with serve_process(args) as (base, _):
        port = port_of(base)
        auth = {"Authorization": f"Bearer {KEY}"}
        cors = {"Origin": "https://app.example"}
        fm = b'{"model": "bert", "text": "a [MASK] ."}'
        answers = exchange(port, [
            http_bytes("GET", "/health"),
            http_bytes("GET", "/v1/models"),
            http_bytes("GET", "/v1/models", headers={"Authorization": "Bearer wrong"}),
            http_bytes("POST", "/v1/fill-mask", fm, {"Authorization": f"Bearer {KEY}x"}),
            http_bytes("GET", "/", headers={"Authorization": KEY}),
            http_bytes("GET", "/v1/models", headers=auth),
            http_bytes("GET", "/v1/models", headers=auth, host="lmforge.test:8080"),
            http_bytes("POST", "/v1/fill-mask", fm, {**auth, **cors}),
            http_bytes("OPTIONS", "/v1/fill-mask", headers={**cors, "Access-Control-Request-Method": "POST",
                                                             "Access-Control-Request-Headers": "authorization"}),
            http_bytes("POST", "/v1/fill-mask", fm, {**auth, "Origin": "https://evil.example"}),
            http_bytes("POST", "/v1/fill-mask", fm, auth),
        ])
    assert answers[0][0] == 200
    err = json.loads(answers[1][2])["error"]
    assert answers[1][0] == 401 and err["type"] == "authentication_error" and "Authorization: Bearer" in err["message"]
    assert answers[1][1]["www-authenticate"] == "Bearer"
    assert answers[2][0] == 401
    assert "API key" in one_line_json_error(*answers[3], lo=401, hi=401)  # lmforge's own shape on its routes
    assert answers[4][0] == 401
    assert answers[5][0] == answers[6][0] == 200
    assert answers[7][0] == 200 and answers[7][1]["access-control-allow-origin"] == "https://app.example"
    assert answers[8][0] == 200 and answers[8][1]["access-control-allow-origin"] == "https://app.example"
    assert "origin" in one_line_json_error(*answers[9], lo=403, hi=403)
    assert "access-control-allow-origin" not in answers[9][1]
    assert answers[10][0] == 200 and "access-control-allow-origin" not in answers[10][1]


def test_binding_beyond_loopback_needs_a_key_or_insecure(folders, capsys, monkeypatch):
    monkeypatch.delenv("LMFORGE_API_KEY", raising=False)
    assert main(["serve", str(folders["gpt"]), "--host", "0.0.0.0", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--api-key" in err and "--insecure" in err
    with socket.socket() as busy:  # a taken port shows that the key check passed: the next check speaks
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        assert main(["serve", str(folders["gpt"]), "--host", "0.0.0.0", "--port", port, "--insecure"]) == 2
        assert "cannot listen" in capsys.readouterr().err
        monkeypatch.setenv("LMFORGE_API_KEY", KEY)
        assert main(["serve", str(folders["gpt"]), "--host", "0.0.0.0", "--port", port]) == 2
        assert "cannot listen" in capsys.readouterr().err
    monkeypatch.setenv("LMFORGE_API_KEY", "")
    assert main(["serve", str(folders["gpt"]), "--api-key", " "]) == 2
    assert "empty" in capsys.readouterr().err


def test_env_key_guards_a_loopback_server(env_key_server):
    base, _ = env_key_server
    assert httpx.get(base + "/v1/models").status_code == 401
    assert httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(base + "/health").status_code == 200


@pytest.fixture(scope="module")
def open_server(folders):
    """An in-process server of the four folders with no key; yields its base URL."""
    with uvicorn_thread(create_app(openai_entries(folders))) as base:
        yield base


def test_a_body_without_content_type_is_read_as_json(open_server):
    body = b'{"model": "bert", "text": "the python is a large [MASK] ."}'
    for headers in ({}, {"Content-Type": "application/x-www-form-urlencoded"}, {"Content-Type": "text/plain"}):
        r = httpx.post(open_server + "/v1/fill-mask", content=body, headers=headers)
        assert r.status_code == 200 and "masks" in r.json(), (headers, r.text)
        assert "access-control-allow-origin" not in r.headers
    r = httpx.post(open_server + "/v1/fill-mask", files={"text": ("a.txt", b"x")})
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    r = httpx.post(open_server + "/v1/fill-mask", content=body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


def _curl_commands(text: str) -> list[str]:
    """The curl commands of a shell text: lines joined while a quote is open or a line ends in a backslash."""
    out, current = [], ""
    for line in text.splitlines():
        current = f"{current}\n{line}" if current else line.strip()
        if current.endswith("\\"):
            continue
        try:
            shlex.split(current, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if current.startswith("curl "):
            out.append(current)
        current = ""
    return out


def _doc_curls() -> list[tuple[str, str]]:
    import argparse

    from lmforge.cli import build_parser

    found = []
    serve = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    found += [("serve --help", c) for c in _curl_commands(serve.epilog)]
    page = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8")
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", page, flags=re.S):
        found += [("docs/serve.md", c) for c in _curl_commands(block)]
    return found


def test_every_curl_example_works(folders):
    """Every curl example of `lmforge serve --help` and docs/serve.md, run as written with real curl against
    the docs' model names on a free port (8000 replaced), answers 2xx, and no POST changes a file on disk."""
    examples = _doc_curls()
    assert len(examples) >= 6 and any(w == "serve --help" for w, _ in examples)
    before = {p: p.stat().st_mtime_ns for f in folders.values() for p in f.rglob("*")}
    entries = openai_entries(folders)
    from lmforge.serve import ServeAccess, loopback_hosts

    keyed = create_app(entries, access=ServeAccess(api_key=KEY, allowed_hosts=loopback_hosts("127.0.0.1")))
    plain = create_app(entries, access=ServeAccess(allowed_hosts=loopback_hosts("127.0.0.1")))
    failures = []
    for app, needs_key in ((plain, False), (keyed, True)):
        port = free_port()
        with uvicorn_thread(app, port):
            for where, command in examples:
                if needs_key and "LMFORGE_API_KEY" not in command:
                    continue
                run = re.sub(r"(localhost|127\.0\.0\.1):8000", rf"\g<1>:{port}", command)
                run = run.replace("curl ", "curl -w '\\n@@%{http_code}' ", 1)
                proc = subprocess.run(["bash", "-c", run], capture_output=True, text=True, timeout=120,
                                      env={**os.environ, "LMFORGE_API_KEY": KEY})
                status = proc.stdout.rsplit("@@", 1)[-1]
                if proc.returncode != 0 or not status.startswith("2"):
                    failures.append(f"{where}: {command}\n -> exit {proc.returncode}, {proc.stdout[-500:]}")
    assert not failures, "\n".join(failures)
    assert {p: p.stat().st_mtime_ns for f in folders.values() for p in f.rglob("*")} == before


def test_the_python_example_of_the_docs_runs(folders, capsys):
    page = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8")
    example = next(b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "from openai import" in b)
    port = free_port()
    with uvicorn_thread(create_app(openai_entries(folders)), port):
        exec(compile(example.replace(":8000", f":{port}"), "docs/serve.md", "exec"), {})
    assert capsys.readouterr().out.strip()
