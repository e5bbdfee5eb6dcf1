"""`lazyattn serve` as a user runs it: a subprocess on a free local port, stopped with SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(*args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`lazyattn serve --model tiny` on a free local port with `args`; returns once /health answers 200. The
    document registry is kept in memory unless `args` say where."""
    port = _free_port()
    if "--state-dir" not in args and "--registry-url" not in args:
        args = (*args, "--registry-url", "memory")
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "lazyattn.cli",
        "serve",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--kv-cache-gb",
        "0.05",
        "--page-size",
        "16",
        "--no-warm-up",
        "--log-level",
        "warning",
        *args,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("lazyattn serve did not come up")
        time.sleep(0.2)


def test_serve_command():
    proc, url = start_serve(
        "--api-key",
        "k1",
        "--max-waiting",
        "4",
        "--prompt-layout",
        "tulu3-block-ft",
        env={**os.environ, "LAZYATTN_API_KEYS": "k2"},
    )
    try:
        assert httpx.get(f"{url}/v1/models").status_code == 401
        for key in ("k1", "k2"):  # from the flag and from the environment
            r = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny"
        r = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"Authorization": "Bearer k1"},
            timeout=60,
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "documents": ["a document"]},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # uvicorn shuts down gracefully, then re-raises the signal it caught: exit by SIGTERM is the normal end.
    output = proc.stdout.read()
    assert proc.returncode in (0, -signal.SIGTERM), output
    assert "Traceback" not in output, output


def test_a_busy_port_fails_before_the_model_loads():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # A model that does not exist: the port is checked first, so the error is the port's.
        cmd = [sys.executable, "-m", "lazyattn", "serve", "--model", "/nonexistent/model", "--device", "cpu"]
        run = subprocess.run(
            [*cmd, "--host", "127.0.0.1", "--port", str(port)], capture_output=True, text=True, timeout=120
        )
    assert run.returncode == 1, run.stderr
    assert f"error: cannot listen on 127.0.0.1:{port}: Address already in use" in run.stderr
    assert "listening on http" not in run.stderr and "Traceback" not in run.stderr


def test_random_weights_read_only_the_config(tmp_path):
    """--random-weights: a directory with nothing but config.json serves (the benchmarks' real shapes); without a
    tokenizer there, text is read as bytes, one token each."""
    import transformers

    from tests.model.checkpoints import SMALL

    transformers.LlamaConfig(**{**SMALL, "vocab_size": 512}).to_json_file(tmp_path / "config.json")
    cmd = [sys.executable, "-m", "lazyattn.cli", "serve", "--model", str(tmp_path), "--device", "cpu"]
    cmd += ["--port", str(_free_port()), "--kv-cache-gb", "0.05", "--no-warm-up"]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "no weight files" in refused.stderr  # and not asked to draw them
    cmd[cmd.index("--port") + 1] = str(port := _free_port())
    proc = subprocess.Popen([*cmd, "--random-weights", "--log-level", "warning"], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "lazyattn serve --random-weights did not come up"
            time.sleep(0.2)
        usage = []
        for doc in ("abcdefghij" * 3, "abcdefghij" * 4):
            body = {"prompt": "Q?", "documents": [doc], "max_tokens": 2, "temperature": 0.0}
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            usage.append(r.json()["usage"]["prompt_tokens"])
        assert usage[1] - usage[0] == 10  # ten more characters, ten more tokens
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def _serve_quickly(*args: str) -> subprocess.CompletedProcess:
    """`lazyattn serve` with `args`, expected to end before it serves (the default port is replaced by a free one)."""
    cmd = [sys.executable, "-m", "lazyattn", "serve", "--model", "tiny", "--device", "cpu", "--registry-url", "memory"]
    cmd += ["--port", str(_free_port()), "--kv-cache-gb", "0.05", "--page-size", "16", "--no-warm-up", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("lazyattn: warning:")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--api-key", ""], "error: --api-key must not be empty (or only spaces)"),
        (["--api-key", "k1", "--api-key", "  "], "error: --api-key must not be empty (or only spaces)"),
        (["--port", "80000"], "error: --port must be in 1..65535, got 80000"),
        (["--port", "-1"], "error: --port must be in 1..65535, got -1"),
        (["--max-waiting", "0"], "error: --max-waiting must be >= 1, got 0"),
        (["--max-request-sequences", "0"], "error: --max-request-sequences must be >= 1, got 0"),
        (["--max-request-documents", "0"], "error: --max-request-documents must be >= 1, got 0"),
        (["--max-documents", "0"], "error: --max-documents must be >= 1, got 0"),
        (["--max-body-mb", "0"], "error: --max-body-mb must be >= 1, got 0"),
        (["--shutdown-timeout", "-1"], "error: --shutdown-timeout must be a number of seconds >= 0, got -1.0"),
        (["--cpu-threads", "0"], "error: --cpu-threads must be >= 1, got 0"),
        (
            ["--mode", "block", "--ape-prefix"],
            "error: ape_prefix needs mode 'lazy': block mode copies documents encoded at position 0",
        ),
        (
            ["--mode", "full", "--ape-temperature", "0.5"],
            "error: ape_temperature=0.5, ape_scale=1.0, ape_tilt=0.0 need mode "
            "'lazy' or 'block': full mode attends to every document in context already",
        ),
        (["--ape-scale", "0"], "error: ape_scale must be a finite number > 0, got 0.0"),
        (
            ["--mode", "block", "--answer", "both-placements"],
            "error: answer 'both-placements' reads the documents in parallel, which needs mode 'lazy', not 'block'",
        ),
        (["--confidence-tokens", "0"], "error: --confidence-tokens must be >= 1, got 0"),
        (["--disk-cache-dir", "{file}"], "error: disk_cache_dir {file}: exists and is not a directory"),
        (
            ["--disk-cache-dir", "{file}/kv"],
            "error: disk_cache_dir {file}/kv: cannot create the directory: Not a directory",
        ),
        # Not writable, whoever runs it (root too): /proc takes no new directories.
        (
            ["--disk-cache-dir", "/proc/lazyattn-kv"],
            "error: disk_cache_dir /proc/lazyattn-kv: cannot create the directory: No such file or directory",
        ),
    ],
)
def test_settings_that_cannot_serve_are_one_line_errors(tmp_path, args, message):
    (tmp_path / "file").write_text("")
    args = [a.format(file=tmp_path / "file") for a in args]
    run = _serve_quickly(*args)
    assert run.returncode == 2, run.stderr
    assert _errors(run.stderr) == [message.format(file=tmp_path / "file")]


def test_ape_options_are_the_servers_default():
    """`--ape-prefix --ape-temperature 0.5`: a request that says nothing is answered as the Python API answers with
    those options; one that turns them off, as plain lazy attention."""
    from lazyattn import LLM, SamplingParams

    body = {"prompt": "Q?", "documents": ["Paris is in France.", "Rome is in Italy."], "max_tokens": 4}
    body.update(temperature=0.0, ignore_eos=True)
    proc, url = start_serve("--ape-prefix", "--ape-temperature", "0.5")
    try:
        default, off = (
            httpx.post(f"{url}/v1/completions", json={**body, **fields}, timeout=60).json()["choices"][0]["text"]
            for fields in ({}, {"ape_prefix": False, "ape_temperature": 1})
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    llm = LLM(model="tiny", device="cpu", progress=False, page_size=16, kv_cache_gb=0.05)
    ape = llm.generate("Q?", params, documents=[body["documents"]], ape_prefix=True, ape_temperature=0.5)[0]
    plain = llm.generate("Q?", params, documents=[body["documents"]])[0]
    assert ape.text != plain.text
    assert (default, off) == (ape.text, plain.text)


def test_keys_are_stripped_and_the_start_up_line_names_the_disk_tier(tmp_path):
    proc, url = start_serve("--api-key", " k1 ", "--disk-cache-dir", str(tmp_path / "kv"), "--disk-cache-gb", "2")
    try:
        r = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    (line,) = [line for line in proc.stdout.read().splitlines() if line.startswith("lazyattn serve:")]
    assert f"; disk tier {tmp_path / 'kv'} (2 GiB);" in line


@pytest.mark.parametrize(
    "host, keyed, warned", [("0.0.0.0", False, True), ("0.0.0.0", True, False), ("localhost", False, False)]
)
def test_a_server_open_to_other_machines_without_a_key_is_warned_about(host, keyed, warned):
    # A model that does not exist: the warning comes before the model loads, and then the command ends.
    key = ["--api-key", "k"] if keyed else []
    run = _serve_quickly("--host", host, "--model", "/nonexistent/model", *key)
    assert run.returncode == 2 and "does not exist" in run.stderr, run.stderr
    warning = f"lazyattn: warning: --host {host} accepts connections from other machines and no API key is set"
    assert (warning in run.stderr) == warned, run.stderr


def test_serve_help_shows_every_default():
    from lazyattn.cli import build_parser

    (sub,) = [a for a in build_parser(["serve"])._actions if isinstance(a, argparse._SubParsersAction)]
    for action in sub.choices["serve"]._actions:
        if action.option_strings and action.nargs != 0 and not isinstance(action, argparse._HelpAction):
            assert "(default: " in action.help, action.option_strings
