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


def test_engine_option_defaults_are_engine_configs():
    """Every subcommand's engine options, parsed from nothing, give EngineConfig's defaults field by field; only the
    device differs by design: the CLI takes the GPU where one is present (bench and eval pick their modes: no
    --mode of the engine's there)."""
    import dataclasses

    import torch

    from lazyattn.cli import engine_options
    from lazyattn.engine.config import EngineConfig

    defaults = EngineConfig()
    for name in ("generate", "serve", "bench", "eval"):
        parser = _subcommands()[name]
        required = ["q"] if name == "generate" else []
        options = engine_options(parser.parse_args(required))
        assert options.pop("device") == ("cuda" if torch.cuda.is_available() else "cpu")
        offered = {a.option_strings[0][2:].replace("-", "_") for a in parser._actions if a.option_strings}
        engine = {f.name for f in dataclasses.fields(EngineConfig)}
        compared = set(options) & offered
        assert len(compared) >= 14 and set(options) <= engine, name
        for field in compared:
            assert options[field] == getattr(defaults, field), f"lazyattn {name} --{field.replace('_', '-')}"


def test_dtype_help_states_the_engines_default():
    """The engine takes bfloat16 on CUDA and float32 on the CPU when no dtype is given; --help says so."""
    import torch

    from lazyattn.engine.config import EngineConfig

    assert EngineConfig(device="cpu").torch_dtype == torch.float32
    assert EngineConfig(device="cuda").torch_dtype == torch.bfloat16
    text = " ".join(_subcommands()["generate"].format_help().split())
    assert "(default: bfloat16 on CUDA, float32 on the CPU)" in text
    assert "checkpoint's" not in text


def test_mode_choices_are_the_one_list_and_each_has_an_implementation():
    from lazyattn.engine.config import MODES
    from lazyattn.engine.modes import MODE_CLASSES, make_mode

    mode = next(a for a in _subcommands()["generate"]._actions if "--mode" in a.option_strings)
    assert tuple(mode.choices) == MODES == ("lazy", "block", "prefix", "full")
    assert tuple(MODE_CLASSES) == MODES and all(make_mode(m).name == m for m in MODES)
