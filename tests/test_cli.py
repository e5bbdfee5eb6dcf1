"""The `lazyattn` command as a newcomer meets it: `python -m lazyattn`, `--version`, help for every option,
one-line errors for usage mistakes."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lazyattn import __version__
from lazyattn.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny", "--device", "cpu", "--page-size", "16", "--kv-cache-gb", "0.01"]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_python_m_lazyattn_and_version():
    run = subprocess.run(
        [sys.executable, "-m", "lazyattn", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout.strip() == f"lazyattn {__version__}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^version = "(.+)"$', pyproject, re.M).group(1) == __version__
    run = subprocess.run([sys.executable, "-m", "lazyattn"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "usage: lazyattn" in run.stderr


def test_every_option_of_every_command_has_help():
    for name, parser in _subcommands().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"lazyattn {name}: {'/'.join(action.option_strings) or action.dest} has no help"


def test_bench_has_one_modes_option_and_cites_the_repository():
    bench = _subcommands()["bench"]
    options = {s: a for a in bench._actions for s in a.option_strings}
    assert options["--mode"] is options["--modes"]
    assert bench.parse_args(["--mode", "prefix"]).modes == "prefix"
    assert bench.parse_args(["--modes", "lazy,block"]).modes == "lazy,block"
    text = bench.format_help()
    assert "DESIGN.md" not in text and "docs/benchmarks.md" in text
    assert (ROOT / "docs" / "benchmarks.md").is_file()


def test_a_missing_document_file_is_a_one_line_error(tmp_path, capsys):
    missing = tmp_path / "missing.txt"
    assert main(["generate", *TINY, "q", "--document-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --document-file {missing}: No such file or directory\n"
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    assert main(["generate", *TINY, "q", "--document-file", str(tmp_path / "latin1.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --document-file") and "utf-8" in err and err.count("\n") == 1


@pytest.mark.parametrize("flags, prompt_tokens", [([], 1 + len(b"<|end|>")), (["--parse-special-tokens"], 2)])
def test_generate_reads_special_token_text_as_plain_text_unless_asked(capsys, flags, prompt_tokens):
    assert main(["generate", *TINY, "--json", "--max-tokens", "1", *flags, "<|end|>"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == prompt_tokens  # <s> + bytes, or <s> <|end|>
