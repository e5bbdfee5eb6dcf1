"""The LAZYATTN_* registry (lazyattn/envs.py): each type parsed, bad values refused with the variable's name, the
README table generated from the declarations, and a setting in the environment reaching what it controls."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lazyattn import LLM, SamplingParams, envs
from lazyattn.envs import EnvSettings, read_env, read_var
from lazyattn.errors import InvalidRequestError

ROOT = Path(__file__).resolve().parents[1]


def test_unset_and_empty_give_the_declared_defaults():
    assert read_env({}) == EnvSettings()
    assert read_env({v.name: " " for v in envs.variables()}) == EnvSettings()
    # the defaults the modules used before the registry held them (hand-copied, not read from the registry)
    d = read_env({})
    assert (d.decode_fusion, d.kv_layout, d.prefill_plan, d.gluon_prefill, d.decode_tma) == (
        True,
        "token",
        True,
        True,
        True,
    )
    assert (d.pdl, d.gemv, d.gemv_table, d.gemv_max_m, d.gemv_prefetch) == ("auto", "auto", None, 64, 0)
    assert (d.tp_allreduce, d.tp_probe_timeout_s, d.tp_stacks_after_s, d.tp_trace) == ("auto", 60.0, 0.0, None)


@pytest.mark.parametrize(
    "name, text, field, want",
    [
        ("LAZYATTN_DECODE_FUSION", "0", "decode_fusion", False),
        ("LAZYATTN_DECODE_FUSION", " Off ", "decode_fusion", False),
        ("LAZYATTN_DECODE_TMA", "true", "decode_tma", True),
        ("LAZYATTN_PREFILL_PLAN", "no", "prefill_plan", False),
        ("LAZYATTN_KV_LAYOUT", " HEAD", "kv_layout", "head"),
        ("LAZYATTN_GEMV", "off", "gemv", "0"),
        ("LAZYATTN_GEMV", "Force", "gemv", "force"),
        ("LAZYATTN_GEMV_MAX_M", " 8 ", "gemv_max_m", 8),
        ("LAZYATTN_GEMV_PREFETCH", "2", "gemv_prefetch", 2),
        ("LAZYATTN_GEMV_TABLE", "/tmp/t.json", "gemv_table", "/tmp/t.json"),
        ("LAZYATTN_PDL", " Rope , norm ", "pdl", "rope,norm"),
        ("LAZYATTN_PDL", "0", "pdl", "0"),
        ("LAZYATTN_TP_ALLREDUCE", "symm_mem", "tp_allreduce", "symm_mem"),
        ("LAZYATTN_TP_PROBE_TIMEOUT_S", "2.5", "tp_probe_timeout_s", 2.5),
        ("LAZYATTN_TP_STACKS_AFTER_S", "0", "tp_stacks_after_s", 0.0),
        ("LAZYATTN_TP_TRACE", "/tmp/trace", "tp_trace", "/tmp/trace"),
    ],
)
def test_each_type_is_parsed(name, text, field, want):
    assert getattr(read_env({name: text}), field) == want


@pytest.mark.parametrize(
    "name, text, accepted",
    [
        ("LAZYATTN_PDL", "maybe", "auto, 1, 0 or a comma-separated list of gemv, attention, rope, norm, sampling"),
        (
            "LAZYATTN_PDL",
            "gemv,decoder",
            "auto, 1, 0 or a comma-separated list of gemv, attention, rope, norm, sampling (decoder: no such kernel "
            "family)",
        ),
        ("LAZYATTN_DECODE_FUSION", "maybe", "one of 1, true, yes, on, 0, false, no, off"),
        ("LAZYATTN_KV_LAYOUT", "nhd", "one of token, head"),
        ("LAZYATTN_GEMV", "sometimes", "one of auto, 0, force"),
        ("LAZYATTN_GEMV_MAX_M", "8.5", "an integer >= 0"),
        ("LAZYATTN_GEMV_PREFETCH", "-1", "an integer >= 0"),
        ("LAZYATTN_TP_ALLREDUCE", "ring", "one of auto, nccl, symm_mem"),
        ("LAZYATTN_TP_PROBE_TIMEOUT_S", "0", "a number of seconds > 0"),
        ("LAZYATTN_TP_STACKS_AFTER_S", "-1", "a number of seconds >= 0"),
    ],
)
def test_bad_values_name_the_variable_and_what_it_accepts(name, text, accepted):
    with pytest.raises(ValueError) as error:
        read_env({name: text})
    assert str(error.value) == f"{name}={text!r}: expected {accepted}"
    assert isinstance(error.value, InvalidRequestError) and error.value.param == name


def test_variables_read_where_they_are_used():
    assert read_var(envs.API_KEYS, {"LAZYATTN_API_KEYS": " k1, ,k2 "}) == ("k1", "k2")
    assert read_var(envs.API_KEYS, {}) == ()
    assert read_var(envs.CACHE, {"LAZYATTN_CACHE": "~/models"}) == "~/models"


@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_cache_directory_is_an_error_not_the_default(text):
    """An empty LAZYATTN_CACHE (a variable expanded from nothing) once put models and the server's state under
    ~/.cache without a word; it is refused as other bad values are, and the CLI says so on one line."""
    with pytest.raises(InvalidRequestError) as error:
        read_var(envs.CACHE, {"LAZYATTN_CACHE": text})
    message = f"LAZYATTN_CACHE={text!r}: expected a directory (unset the variable for the default)"
    assert str(error.value) == message and error.value.param == "LAZYATTN_CACHE"
    env = {**os.environ, "LAZYATTN_CACHE": text}
    run = subprocess.run([sys.executable, "-m", "lazyattn", "models"], env=env, capture_output=True, text=True)
    assert (run.returncode, run.stderr) == (2, f"error: {message}\n")


def test_every_variable_is_declared_once_and_none_is_read_elsewhere():
    names = [v.name for v in envs.variables()]
    assert len(names) == len(set(names)) == 17
    # no module but the registry reads a LAZYATTN_* variable from the environment
    pattern = re.compile(r"(environ|getenv)[^\n]*LAZYATTN_")
    readers = [p for p in (ROOT / "lazyattn").rglob("*.py") if pattern.search(p.read_text()) and p.name != "envs.py"]
    assert readers == []


def test_markdown_lists_every_variable_and_the_readme_table_matches_it():
    run = subprocess.run(
        [sys.executable, "-m", "lazyattn.envs", "--markdown"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    rows = run.stdout.splitlines()
    assert rows[0] == "| Variable | Type | Default | What it does |"
    assert [r.split(" | ")[0].strip("| `") for r in rows[2:]] == [v.name for v in envs.variables()]
    assert "| `LAZYATTN_GEMV_MAX_M` | int | `64` |" in run.stdout
    readme = (ROOT / "README.md").read_text()
    assert run.stdout in readme  # the README's table is the declarations' own


REQUESTS = [([["a", "b"], [1, 2, 3]]), ([["b"], [4, 5]])]
DOCS = {"a": list(range(10, 40)), "b": list(range(50, 70))}


def _generate(llm: LLM):
    outs = llm.generate(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
    )
    return [o.outputs[0].token_ids for o in outs]


def test_settings_in_the_environment_at_construction_reach_the_engine(monkeypatch, kernel_settings):
    """LAZYATTN_KV_LAYOUT=head and LAZYATTN_GEMV=0 set when the engine is made: its KV tensor is stored head by head,
    its kernels see gemv 0, later changes to the environment do not reach it, and its outputs are the default
    engine's."""
    with LLM(model="tiny", device="cpu", page_size=16, progress=False) as llm:
        # token layout: heads adjacent
        assert llm.engine.executor.runner.backend.kv.stride(-2) == llm.engine.model_config.head_dim
        expected = _generate(llm)
    monkeypatch.setenv("LAZYATTN_KV_LAYOUT", "head")
    monkeypatch.setenv("LAZYATTN_GEMV", "0")
    with LLM(model="tiny", device="cpu", page_size=16, progress=False) as llm:
        kv = llm.engine.executor.runner.backend.kv  # [layers, 2, pages, page_size, kv_heads, head_dim] as a view
        assert kv.stride(-2) == kv.shape[3] * kv.shape[5]  # head: a kv head's rows are one block
        assert envs.active() is llm.engine.config.env and envs.active().gemv == "0"
        monkeypatch.setenv("LAZYATTN_GEMV", "force")  # read once: the running engine keeps its settings
        assert envs.active().gemv == "0" and llm.engine.config.env.kv_layout == "head"
        assert _generate(llm) == expected


def test_decode_fusion_setting_reaches_the_loader(monkeypatch, kernel_settings):
    """LAZYATTN_DECODE_FUSION=0 at construction: the engine asks the loader for the unfused model (folded norms are
    decided there, on CUDA), and its outputs on the CPU equal the default engine's."""
    from lazyattn.engine.executor import base

    asked = []
    load = base.load_model
    monkeypatch.setattr(base, "load_model", lambda *a, **kw: asked.append(kw["decode_fusion"]) or load(*a, **kw))
    with LLM(model="tiny", device="cpu", page_size=16, progress=False) as llm:
        expected = _generate(llm)
    monkeypatch.setenv("LAZYATTN_DECODE_FUSION", "0")
    with LLM(model="tiny", device="cpu", page_size=16, progress=False) as llm:
        assert not llm.engine.executor.model.norms_folded
        assert _generate(llm) == expected
    assert asked == [True, False]


def test_a_bad_value_refuses_the_engine_before_it_loads(monkeypatch):
    monkeypatch.setenv("LAZYATTN_PDL", "maybe")
    with pytest.raises(InvalidRequestError, match="LAZYATTN_PDL='maybe'"):
        LLM(model="tiny", device="cpu", progress=False)


@pytest.mark.gpu
def test_decode_fusion_off_runs_the_unfused_model_on_cuda(monkeypatch, kernel_settings):
    """On CUDA the default engine folds the norms (the fused decode path); LAZYATTN_DECODE_FUSION=0 keeps them, and
    the greedy tokens of the two agree."""
    options = dict(model="tiny", device="cuda", dtype="float32", page_size=16, progress=False)
    with LLM(**options) as llm:
        assert llm.engine.executor.model.norms_folded
        expected = _generate(llm)
    monkeypatch.setenv("LAZYATTN_DECODE_FUSION", "0")
    with LLM(**options) as llm:
        assert not llm.engine.executor.model.norms_folded
        assert _generate(llm) == expected
    torch.cuda.empty_cache()


def test_settings_pickle_for_the_tensor_parallel_workers():
    import pickle

    settings = dataclasses.replace(read_env({}), gemv="0", tp_trace="/tmp/x")
    assert pickle.loads(pickle.dumps(settings)) == settings


def test_changed_names_the_variables_that_differ():
    before = read_env({})
    after = read_env({"LAZYATTN_GEMV": "0", "LAZYATTN_PDL": "auto", "LAZYATTN_KV_LAYOUT": "head"})
    assert envs.changed(before, after) == ["LAZYATTN_KV_LAYOUT='head'", "LAZYATTN_GEMV='0'"]
    assert envs.changed(after, after) == []
