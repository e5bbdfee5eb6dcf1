"""The `lazyattn` command as a newcomer meets it: `python -m lazyattn`, `--version`, help for every option,
one-line errors for usage mistakes."""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lazyattn import __version__
from lazyattn.cli import (
    ANSWERING,
    COMMANDS,
    DEFAULT_MODEL,
    RUNS_A_MODEL,
    build_parser,
    local_or_named,
    main,
    say_which_model,
)
from lazyattn.model import hub

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


def _errors(err: str) -> str:
    """stderr without the warning that --model tiny answers with noise."""
    return "".join(line for line in err.splitlines(keepends=True) if not line.startswith("lazyattn: warning:"))


def test_a_missing_document_file_is_a_one_line_error(tmp_path, capsys):
    missing = tmp_path / "missing.txt"
    assert main(["generate", *TINY, "q", "--document-file", str(missing)]) == 2
    err = _errors(capsys.readouterr().err)
    assert err == f"error: --document-file {missing}: No such file or directory\n"
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    assert main(["generate", *TINY, "q", "--document-file", str(tmp_path / "latin1.txt")]) == 2
    err = _errors(capsys.readouterr().err)
    assert err.startswith("error: --document-file") and "utf-8" in err and err.count("\n") == 1


@pytest.mark.parametrize("flags, prompt_tokens", [([], 1 + len(b"<|end|>")), (["--parse-special-tokens"], 2)])
def test_generate_reads_special_token_text_as_plain_text_unless_asked(capsys, flags, prompt_tokens):
    assert main(["generate", *TINY, "--no-chat", "--json", "--max-tokens", "1", *flags, "<|end|>"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == prompt_tokens  # <s> + bytes, or <s> <|end|>


def test_version_and_help_do_not_import_torch():
    code = (
        "import sys\n"
        "from lazyattn.cli import main\n"
        f"for argv in [['--version'], ['-h'], *[[c, '-h'] for c in {list(COMMANDS)!r}]]:\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, argv\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"lazyattn {__version__}\n") and "usage: lazyattn generate" in run.stdout
    assert run.stdout.rstrip().endswith("torch imported: False")


def test_top_level_help_is_each_commands_own():
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert {a.dest: a.help for a in sub._choices_actions} == COMMANDS


def test_commands_that_answer_questions_default_to_a_real_model():
    commands = _subcommands()
    for name in ANSWERING:
        assert commands[name].get_default("model") == DEFAULT_MODEL == "smollm2", name
    assert commands["bench"].get_default("model") == "tiny"  # a benchmark needs no real weights


def test_model_help_and_the_models_command_name_every_named_model(capsys):
    names = ["tiny", *hub.NAMED_MODELS, *hub.NAMED_ADAPTERS]
    for command, parser in _subcommands().items():
        (model,) = [a for a in parser._actions if "--model" in a.option_strings] or [None]
        if model is not None and command != "finetune":
            assert all(name in model.help for name in names), command
    assert main(["models"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert listed == names


def test_a_path_that_exists_wins_over_a_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert local_or_named("smollm2-block") == "smollm2-block"  # no such folder here: the shipped adapter
    say_which_model("generate", "smollm2-block", "smollm2-block")
    assert str(hub.ADAPTERS_DIR / "smollm2-block") in capsys.readouterr().err
    (tmp_path / "smollm2-block").mkdir()  # e.g. `lazyattn finetune --out smollm2-block`
    assert local_or_named("smollm2-block") == str(tmp_path / "smollm2-block")
    assert local_or_named(str(tmp_path / "other")) == str(tmp_path / "other")
    say_which_model("generate", "smollm2-block", str(tmp_path / "smollm2-block"))
    assert f"the local directory {tmp_path / 'smollm2-block'} (not the named model" in capsys.readouterr().err


def test_the_random_model_warns_where_it_answers_questions(capsys):
    assert main(["generate", *TINY, "--max-tokens", "1", "q"]) == 0
    assert "lazyattn: warning: --model tiny is built in, random weights" in capsys.readouterr().err
    say_which_model("bench", "tiny", "tiny")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flag", [[], ["--chat"], ["--no-chat"]])
def test_generate_uses_the_chat_template_unless_told_not_to(capsys, flag):
    from lazyattn.engine.llm import LLM
    from lazyattn.engine.sampling import SamplingParams

    docs = ["The harp was built by Maren.", "Oskarn is a port."]
    argv = ["generate", *TINY, "--json", "--max-tokens", "4", *flag, "Who built it?", "-d", docs[0], "-d", docs[1]]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    llm = LLM(model="tiny", device="cpu", page_size=16, kv_cache_gb=0.01, progress=False)
    params = SamplingParams(max_tokens=4, temperature=0.0)
    if flag == ["--no-chat"]:
        want = llm.generate(["Who built it?"], params, documents=[docs])[0]
    else:  # tiny has a chat template: chat is the default
        want = llm.chat([{"role": "user", "content": "Who built it?"}], params, documents=[docs])[0]
    assert got["token_ids"] == want.token_ids
    assert got["prompt_tokens"] == want.num_document_tokens + len(want.prompt_token_ids)


@pytest.mark.parametrize("answer", ["best-document", "confidence-order", "each-last", "both-orders", "both-placements"])
def test_generate_answers_from_the_best_document_as_the_python_api_does(capsys, answer):
    from lazyattn.engine.llm import LLM
    from lazyattn.engine.sampling import SamplingParams

    docs = ["The harp was built by Maren.", "Oskarn is a port.", "Tides rise twice a day."]
    flags = ["-d", docs[0], "-d", docs[1], "-d", docs[2], "--answer", answer]
    assert main(["generate", *TINY, "--json", "--max-tokens", "4", "Who built it?", *flags]) == 0
    got = json.loads(capsys.readouterr().out)
    llm = LLM(model="tiny", device="cpu", page_size=16, kv_cache_gb=0.01, progress=False)
    params = SamplingParams(max_tokens=4, temperature=0.0)
    conv = [{"role": "user", "content": "Who built it?"}]
    want = llm.chat(conv, params, documents=[docs], answer=answer)[0]
    assert (got["token_ids"], got["answered_from"]) == (want.token_ids, want.answered_from)
    assert got["document_order"] == want.document_order
    assert got["read_in_parallel"] == want.read_in_parallel
    if answer not in (
        "each-last",
        "both-orders",
        "both-placements",
    ):  # its order is null where the prompt as given was the surest
        assert (want.document_order is None) == (answer == "best-document")
    with pytest.raises(SystemExit):  # argparse's own error for a strategy that does not exist
        main(["generate", *TINY, "q", "--answer", "best"])


def test_every_model_command_takes_cpu_threads():
    commands = _subcommands()
    required = {"generate": ["q"], "finetune": ["--out", "x"]}
    for name in RUNS_A_MODEL:
        assert commands[name].parse_args(["--cpu-threads", "3", *required.get(name, [])]).cpu_threads == 3
    assert commands["bench"].get_default("cpu_threads") == 1 and commands["generate"].get_default("cpu_threads") is None


def test_cpu_threads_sets_torchs_threads(capsys):
    import torch

    before = torch.get_num_threads()
    try:
        assert main(["generate", *TINY, "--max-tokens", "1", "--cpu-threads", "1", "q"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_finetune_summary_reports_where_the_loss_went(monkeypatch, tmp_path, capsys):
    from lazyattn.finetune import cli as finetune_cli
    from lazyattn.finetune import train

    assert finetune_cli.first_and_last_loss([7.0, 6.0, 5.0, 4.0, 3.0]) == (6.5, 3.5)  # halves; the middle step out
    assert finetune_cli.first_and_last_loss([float(i) for i in range(30, 0, -1)]) == (25.5, 5.5)  # 10 and 10
    assert finetune_cli.first_and_last_loss([2.0]) == (2.0, 2.0)
    losses = [7.0, 6.0, 5.0, 4.0, 3.0, 3.0]
    monkeypatch.setattr(train, "finetune", lambda cfg, command: train.FinetuneResult(tmp_path, losses, 600, 2.0))
    assert main(["finetune", "--model", "tiny", "--out", str(tmp_path), "--steps", "6"]) == 0
    assert capsys.readouterr().out.startswith("loss 6.000 -> 3.333 over 6 steps, 600 tokens in 2 s")


def test_ctrl_c_is_one_line_and_exit_code_130():
    cmd = [sys.executable, "-m", "lazyattn", "demo", "--model", "tiny", "--device", "cpu"]
    # A terminal's Ctrl-C reaches a process whose SIGINT is at its default. A child inherits an ignored SIGINT (Python
    # then installs no KeyboardInterrupt handler), and the test process may have one ignored by whatever ran in it
    # before (a server's or Ray's handlers), so the child starts with the default, as under a shell.
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        first = proc.stderr.readline()
        assert first.startswith("lazyattn: warning: --model tiny"), first
        first = proc.stderr.readline()  # the demo is under way: loading its first engine
        assert first.startswith("lazyattn demo: lazy mode: loading"), first
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(60) == 130
    finally:
        proc.kill()
    assert rest.splitlines()[-1] == "interrupted" and "Traceback" not in rest, rest


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
        # --model differs by design too: commands that answer questions default to a real model (tested above).
        assert options.pop("model") == ("tiny" if name == "bench" else DEFAULT_MODEL)
        offered = {a.option_strings[0][2:].replace("-", "_") for a in parser._actions if a.option_strings}
        engine = {f.name for f in dataclasses.fields(EngineConfig)}
        compared = set(options) & offered
        assert len(compared) >= 13 and set(options) <= engine, name
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
    (dtype,) = [a for a in _subcommands()["generate"]._actions if "--dtype" in a.option_strings]
    assert "checkpoint's" not in dtype.help


def test_mode_choices_are_the_one_list_and_each_has_an_implementation():
    from lazyattn.engine.config import MODES
    from lazyattn.engine.modes import MODE_CLASSES, make_mode

    mode = next(a for a in _subcommands()["generate"]._actions if "--mode" in a.option_strings)
    assert tuple(mode.choices) == MODES == ("lazy", "block", "prefix", "full")
    assert tuple(MODE_CLASSES) == MODES and all(make_mode(m).name == m for m in MODES)


def test_a_tiny_top_p_generates_greedily(capsys):
    """A top_p below float32's smallest number once dropped every token: the answer was id 0 at every step."""
    argv = ["generate", *TINY, "--json", "--no-chat", "--max-tokens", "8", "q"]
    assert main(argv) == 0  # temperature 0: greedy
    greedy = json.loads(capsys.readouterr().out)["token_ids"]
    assert main([*argv, "--temperature", "1", "--top-p", "1e-300"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == greedy


def test_generate_answers_with_one_of_its_choices(capsys):
    argv = ["generate", *TINY, "--json", "--no-chat", "--max-tokens", "9", "--temperature", "1.5", "q"]
    for seed in range(3):
        assert main([*argv, "--sampling-seed", str(seed), "--choice", "yes", "--choice", "no way"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["text"] in ("yes", "no way") and out["finish_reason"] == "stop"
    assert main([*argv, "--choice", ""]) == 2
    assert "guided_choice must be strings of 1 to 256 characters" in capsys.readouterr().err


def test_generate_draws_no_progress_bar_where_stderr_is_no_terminal(capsys):
    assert main(["generate", *TINY, "--max-tokens", "2", "q"]) == 0
    err = _errors(capsys.readouterr().err)
    assert err == "", err


def test_an_unknown_model_names_the_named_models(capsys):
    assert main(["generate", "--model", "no-such-model", "--device", "cpu", "q"]) == 2
    err = capsys.readouterr().err
    names = ", ".join(["tiny", *hub.NAMED_MODELS, *hub.NAMED_ADAPTERS])
    assert err == (
        "error: model 'no-such-model' does not exist: no file or directory has that path, and it is not a named "
        f"model ({names}; `lazyattn models` describes them)\n"
    )
