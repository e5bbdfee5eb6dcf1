"""The quickstart demo on the offline `tiny` model: same tokens within each semantics, the reuse each mode
promises, and the printed report (the SmolLM2 run is the same code; its model is tested in tests/model)."""

from __future__ import annotations

from lazyattn import demo


def test_demo_modes_agree_and_reuse_what_they_promise():
    progress = []
    results = demo.run_demo("tiny", max_tokens=3, say=progress.append)
    assert [line.split(":")[0] for line in progress] == [f"{m} mode" for m in demo.MODES for _ in range(3)]
    assert all(line.startswith(f"{m} mode: loading tiny") for line, m in zip(progress[::3], demo.MODES))
    assert all(" mode: done in " in line for line in progress[2::3])
    assert results["lazy"]["tokens"] == results["block"]["tokens"]
    assert results["prefix"]["tokens"] == results["full"]["tokens"]
    assert all(len(t) == 3 for r in results.values() for t in r["tokens"])
    # Shuffled orders: lazy hits every document seen before, prefix only exact prefixes, full nothing.
    ratio = {m: r["hits"] / max(r["lookups"], 1) for m, r in results.items()}
    assert ratio["lazy"] == ratio["block"] > ratio["prefix"] > 0 and results["full"]["lookups"] == 0
    assert results["lazy"]["prefilled"] == results["block"]["prefilled"] < results["prefix"]["prefilled"]
    assert results["prefix"]["prefilled"] < results["full"]["prefilled"]
    assert all(r["ttft_ms"] > 0 for r in results.values())


def test_workload_puts_each_answer_among_shuffled_documents():
    requests = demo.workload()
    assert len(requests) == len(demo.QUESTIONS)
    orders = set()
    for (messages, docs), (question, answer) in zip(requests, demo.QUESTIONS):
        assert messages == [{"role": "user", "content": question}]
        assert demo.DOCS[answer] in docs and len(docs) == 3 == len({d["title"] for d in docs})
        orders.add(tuple(d["title"] for d in docs))
    assert len(orders) == len(requests)


def test_main_prints_answers_and_the_table(capsys):
    assert demo.main("tiny") == 0
    out, err = capsys.readouterr()
    for question, _ in demo.QUESTIONS:
        assert f"Q: {question}" in out
    for mode in demo.MODES:
        assert f"\n{mode} " in out
    assert "lazy == block (same tokens, one cached copy vs private re-rotated copies): True" in out
    progress = err.splitlines()  # as it goes, on stderr: the report on stdout stays clean
    assert len(progress) == 3 * len(demo.MODES) and all(line.startswith("lazyattn demo: ") for line in progress)
