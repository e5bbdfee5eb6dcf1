"""Padding a prefill step to a CUDA-graph bucket (engine/prefill_graphs.py) changes nothing for its real rows.

The graphs themselves need a GPU (tests/engine/test_engine_gpu.py, graphs against eager). Here, on the CPU: which
bucket a step takes, and that the padded step (empty entries, the padding entry, padding rows) gives the
unpadded step's logits through the tiny model (reference backend), and the unpadded step's attention rows
through the Triton prefill kernel (interpreted), split-KV included, with the pool written only by real rows.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazyattn.engine.graph_inputs import TABLES, StepInputs, fill_tables, table_views
from lazyattn.engine.prefill_graphs import ENTRY_BUCKETS, StepLayout, pick_bucket
from lazyattn.kernels.backend import ForwardBatch, ReferenceBackend
from lazyattn.kernels.paged import EntryPages, PagedBatch, page_fill
from lazyattn.kernels.prefill_plan import PLAN_WIDTH, split_plan
from lazyattn.kernels.rope import RopeTables
from lazyattn.kernels.triton_backend import TritonBackend
from lazyattn.model.config import ModelConfig
from lazyattn.model.llama import CausalLM

PAGE = 16
WIDTH = 8


def step_of(runs: list[tuple[EntryPages, list[int], int, list[int], bool]]) -> StepInputs:
    """runs: (context then own pages, tokens, first position, slots, samples) per entry."""
    step = StepInputs([], [], [], [], [], [], [], is_decode=False)
    for entry, tokens, first, slots, samples in runs:
        step.tokens += tokens
        step.positions += range(first, first + len(tokens))
        step.slots += slots
        step.entries.append(entry)
        step.q_lens.append(len(tokens))
        step.q_starts.append(first)
        if samples:
            step.logits_rows.append(len(step.tokens) - 1)
    return step


def eager_inputs(step: StepInputs) -> tuple[torch.Tensor, ForwardBatch]:
    fb = ForwardBatch(
        torch.tensor(step.positions),
        torch.tensor(step.slots),
        PagedBatch.build(step.entries, step.q_lens, step.q_starts),
        step.is_decode,
        torch.tensor(step.logits_rows, dtype=torch.int64),
    )
    return torch.tensor(step.tokens), fb


def padded_inputs(step: StepInputs, bucket: tuple[int, int], num_splits: int | None = None, plan_splits: int = 0):
    layout = StepLayout(128, 8, WIDTH, PAGE, plan_splits)
    buffers = layout.buffers("cpu")
    layout.fill(buffers, step, *bucket, num_splits)
    return layout.views(buffers, *bucket, num_splits=num_splits)


def rag_step(vocab: int) -> StepInputs:
    """Entry 0: a 5-token question over two cached documents (pages 0-1 at delta 0, page 2 at delta 20) and its
    own page 5 (already holding 3 tokens of it). Entry 1: a fresh 9-token prompt on page 6, not sampling.
    Entry 2: a 2-token chunk over entry 1's page, sampling."""
    g = torch.Generator().manual_seed(3)
    tok = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()  # noqa: E731
    q0 = EntryPages([0, 1, 2], [0, 0, 20], [16, 4, 11]).then([5], [8])
    first0 = 31 + 3
    return step_of(
        [
            (q0, tok(5), first0, [5 * PAGE + 3 + i for i in range(5)], True),
            (EntryPages([], [], []).then([6], page_fill(9, PAGE)), tok(9), 0, [6 * PAGE + i for i in range(9)], False),
            (EntryPages([], [], []).then([6], [11]), tok(2), 9, [6 * PAGE + 9, 6 * PAGE + 10], True),
        ]
    )


def test_fill_tables_writes_what_paged_batch_builds():
    """The graphs' entry-major tables hold PagedBatch.build's tables (an independent construction), also when
    the buffer held a longer step before (stale columns are cleared)."""
    entries = [
        EntryPages([3, 1, 4], [0, 7, 7], [16, 16, 5], [0, 2, 0]),
        EntryPages([9], [0], [12]),
        EntryPages([2, 6], [5, 0], [16, 1]),
    ]
    tables = torch.full((6, TABLES, WIDTH), 99, dtype=torch.int32)
    fill_tables(tables.numpy(), [EntryPages(list(range(WIDTH)), [1] * WIDTH, [16] * WIDTH, [1] * WIDTH)] * 6)
    fill_tables(tables.numpy(), entries)
    built = PagedBatch.build(entries, [1, 1, 1], [0, 0, 0])
    width = built.max_pages
    got = table_views(tables[:3])
    for name, mine, want in zip(
        ("pages", "deltas", "valid", "starts", "firsts"),
        got,
        (built.pages, built.deltas, built.valid, built.starts, built.firsts),
    ):
        assert torch.equal(mine[:, :width], want), name
    pages, deltas, valid, starts, firsts = (t[:, width:] for t in got)
    assert not (pages.any() or deltas.any() or valid.any() or firsts.any())
    assert starts.eq(built.valid.sum(1, keepdim=True)).all()  # the running sum goes on past the last page


def test_pick_bucket_takes_the_smallest_fitting_bucket():
    one = step_of([(EntryPages([0], [0], [16]), list(range(32)), 0, [-1] * 32, True)])
    assert pick_bucket(one, WIDTH) == (32, 2)
    assert pick_bucket(step_of([(EntryPages([0], [0], [16]), [1] * 33, 0, [-1] * 33, True)]), WIDTH) == (64, 2)
    assert pick_bucket(rag_step(100), WIDTH) == (16, 4)  # 16 tokens, 3 entries + the padding entry
    seven = step_of([(EntryPages([0], [0], [1]), [1], 0, [-1], True)] * 7)
    assert pick_bucket(seven, WIDTH) == (16, 8)
    assert pick_bucket(step_of([(EntryPages([0], [0], [1]), [1], 0, [-1], True)] * 8), WIDTH) == (16, 16)
    mixed = step_of(
        [(EntryPages([0], [0], [1]), [1], 0, [-1], True)] * 40
        + [(EntryPages([0], [0], [16]), [1] * 30, 0, [-1] * 30, True)]
    )
    assert pick_bucket(mixed, WIDTH) == (128, 64)  # decode rows beside a new request's question
    assert pick_bucket(step_of([(EntryPages([0], [0], [1]), [1], 0, [-1], True)] * 64), WIDTH) is None
    assert pick_bucket(step_of([(EntryPages([0], [0], [16]), [1] * 129, 0, [-1] * 129, True)]), WIDTH) == (256, 2)
    questions = step_of([(EntryPages([0], [0], [16]), [1] * 32, 0, [-1] * 32, True)] * 5)  # 5 questions at once
    assert pick_bucket(questions, WIDTH) == (256, 8)
    assert pick_bucket(step_of([(EntryPages([0], [0], [16]), [1] * 513, 0, [-1] * 513, True)]), WIDTH) is None
    wide = EntryPages(list(range(WIDTH + 1)), [0] * (WIDTH + 1), [16] * (WIDTH + 1))
    assert pick_bucket(step_of([(wide, [1], 0, [-1], True)]), WIDTH) is None
    decode = step_of([(EntryPages([0], [0], [2]), [1], 1, [1], True)])
    decode.is_decode = True
    assert pick_bucket(decode, WIDTH) is None


def test_padding_layout_marks_padding_rows_and_entries():
    step = rag_step(100)
    ids, fb = padded_inputs(step, (32, 4))
    assert ids[:16].tolist() == step.tokens and ids.shape == (32,)
    assert fb.slot_mapping[16:].eq(-1).all() and fb.slot_mapping[:16].tolist() == step.slots
    assert fb.positions[16:].tolist() == list(range(16))
    assert fb.attn.cu_seqlens_q.tolist() == [0, 5, 14, 16, 32]  # entry 3 (padding) owns rows 16..31
    assert fb.attn.num_pages.tolist() == [4, 1, 1, 1]
    assert fb.attn.starts[0, :4].tolist() == [0, 16, 20, 31]
    assert fb.logits_indices.tolist() == [4, 15, 0, 0]


def test_buffers_views_are_disjoint_and_one_copy_carries_a_bucket():
    """The three views share one byte buffer without overlapping, and the bytes `upto(entries)` names hold all a
    bucket reads: a copy of just those into a fresh buffer (what the graphs' one host-to-device copy moves) gives
    the same inputs as the filled buffer, after a larger step left other values in the destination."""
    layout = StepLayout(128, 8, WIDTH, PAGE)
    src, dst = layout.buffers("cpu"), layout.buffers("cpu")
    for view, value in ((src.i64, -1), (src.head, -2), (src.tables, -3)):
        view.fill_(value)
    assert src.i64.eq(-1).all() and src.head.eq(-2).all() and src.tables.eq(-3).all()
    big = step_of([(EntryPages(list(range(WIDTH)), [3] * WIDTH, [16] * WIDTH), [7] * 18, 0, [1] * 18, True)] * 7)
    layout.fill(dst, big, 128, 8)
    step, bucket = rag_step(100), (32, 4)
    layout.fill(src, step, *bucket)
    dst.raw[: src.upto(bucket[1]).numel()].copy_(src.upto(bucket[1]))
    (ids_a, fb_a), (ids_b, fb_b) = layout.views(src, *bucket), layout.views(dst, *bucket)
    assert torch.equal(ids_a, ids_b) and ids_a[:16].tolist() == step.tokens
    for name in ("positions", "slot_mapping", "logits_indices"):
        assert torch.equal(getattr(fb_a, name), getattr(fb_b, name)), name
    for name in ("cu_seqlens_q", "q_start", "num_pages", "pages", "deltas", "valid", "starts", "firsts"):
        assert torch.equal(getattr(fb_a.attn, name), getattr(fb_b.attn, name)), name


@pytest.mark.parametrize("bucket", [(16, 4), (64, 8)])
def test_padded_step_gives_the_eager_logits_through_the_model(bucket):
    cfg = ModelConfig.tiny()
    torch.manual_seed(0)
    model = CausalLM(cfg).eval()
    tables = RopeTables.build(cfg.rope, cfg.max_position)
    step = rag_step(cfg.vocab_size)
    logits, pools = [], []
    for inputs in (eager_inputs(step), padded_inputs(step, bucket)):
        g = torch.Generator().manual_seed(1)
        kv = torch.randn(cfg.num_layers, 2, 10, PAGE, cfg.num_kv_heads, cfg.head_dim, generator=g)
        backend = ReferenceBackend(kv, tables, cfg.attn_scale)
        ids, fb = inputs
        with torch.inference_mode():
            logits.append(model.compute_logits(model(ids, fb, backend)[fb.logits_indices]))
        pools.append(kv)
    eager, padded = logits
    torch.testing.assert_close(padded[: len(step.logits_rows)], eager, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(padded).all()
    assert torch.equal(pools[0], pools[1])  # padding rows store nothing


@pytest.mark.parametrize(
    ("bucket", "num_splits", "plan_splits"), [((32, 4), None, 0), ((32, 8), 3, 0), ((32, 8), 3, 4), ((32, 4), 5, 8)]
)
def test_padded_step_gives_the_eager_rows_through_the_prefill_kernel(bucket, num_splits, plan_splits):
    """Padded and split (the kernel's own chunks, or the host's plan that fill writes: 3 splits over entry 0's
    three runs, 5 over them and the padding entry's page) or not, the real rows are the eager call's."""
    hq, hkv, dim = 4, 2, 32
    cfg = ModelConfig.tiny()
    tables = RopeTables.build(cfg.rope, 512)
    step = rag_step(100)
    g = torch.Generator().manual_seed(5)
    t = len(step.tokens)
    q, k, v = (torch.randn(t, h, dim, generator=g) for h in (hq, hkv, hkv))
    kv0 = torch.randn(1, 2, 10, PAGE, hkv, dim, generator=g)
    outs, pools = [], []
    for padded in (False, True):
        kv = kv0.clone()
        backend = TritonBackend(kv, tables, dim**-0.5)
        if padded:
            _, fb = padded_inputs(step, bucket, num_splits, plan_splits)
            assert (fb.attn.plan is not None) == (plan_splits > 0)
            pad = bucket[0] - t
            qp, kp, vp = (torch.cat([x, torch.randn(pad, *x.shape[1:], generator=g)]) for x in (q, k, v))
            out = backend.attend(0, qp, kp, vp, fb)
            assert torch.isfinite(out).all()
            out = out[:t]
        else:
            out = backend.attend(0, q, k, v, eager_inputs(step)[1])
        outs.append(out)
        pools.append(kv)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(pools[0], pools[1])


def test_fill_writes_each_entrys_plan_after_its_tables():
    """fill's plans (runs found with numpy in the filled tables) are split_plan's over the entries' own delta lists
    (a Python walk), the padding entry's and empty entries' included; the bytes `upto` names carry them; and a
    bucket without a plan (one split, or a layout without plans) gets none."""
    step, bucket = rag_step(100), (32, 8)
    layout = StepLayout(128, 8, WIDTH, PAGE, plan_splits=4)
    src, dst = layout.buffers("cpu"), layout.buffers("cpu")
    dst.raw.fill_(0xFF)
    layout.fill(src, step, *bucket, 3)
    dst.raw[: src.upto(bucket[1]).numel()].copy_(src.upto(bucket[1]))
    _, fb = layout.views(dst, *bucket, num_splits=3)
    empty = [EntryPages([], [], [])] * (bucket[1] - 1 - len(step.entries))
    entries = step.entries + empty + [EntryPages([0], [0], [1])]
    want = [list(split_plan(list(e.deltas), 3)) if e.pages else [0] * 3 * PLAN_WIDTH for e in entries]
    assert fb.attn.plan.shape == (bucket[1], 3, PLAN_WIDTH)
    assert fb.attn.plan.reshape(bucket[1], -1).tolist() == want
    assert fb.attn.plan[0, :, 0].tolist() == [1, 1, 1]  # entry 0's runs: pages 0-1, page 2, its own page 3
    assert layout.views(dst, *bucket, num_splits=1)[1].attn.plan is None
    plain = StepLayout(128, 8, WIDTH, PAGE)
    buffers = plain.buffers("cpu")
    plain.fill(buffers, step, *bucket, 3)
    assert plain.views(buffers, *bucket, num_splits=3)[1].attn.plan is None


@pytest.mark.parametrize(
    ("q_dtype", "pages", "ape", "hopper"),
    [
        (torch.bfloat16, torch.bfloat16, False, True),
        (torch.bfloat16, torch.float8_e4m3fn, False, True),
        (torch.float16, torch.float8_e4m3fn, False, True),
        (torch.float32, torch.float8_e4m3fn, False, False),  # the Hopper kernel takes no fp32 q: prefill.py's plan
        (torch.float32, torch.float32, False, False),
        (torch.bfloat16, torch.float16, False, False),
        (torch.bfloat16, torch.bfloat16, True, False),  # temperature tables: prefill.py's kernel
    ],
)
def test_a_bucket_plans_the_kernel_that_will_take_its_calls(monkeypatch, q_dtype, pages, ape, hopper):
    """The split rule a bucket fixes is that of the kernel `supports` gives its calls to at run time, decided from
    the model's dtype and the pool's: the Hopper kernel's (no plan) only for a 16-bit model over pages of its dtype
    or FP8 ones. The shapes are taken as the Hopper kernel's (no Hopper GPU here)."""
    from types import SimpleNamespace

    from lazyattn.engine import prefill_graphs
    from lazyattn.kernels import prefill_hopper

    monkeypatch.setattr(prefill_hopper, "shape_supported", lambda *a: True)
    monkeypatch.setattr(prefill_hopper, "takes_layout", lambda cache: True)
    monkeypatch.setattr(prefill_hopper, "num_splits", lambda *a, **k: 7)
    monkeypatch.setattr(prefill_graphs, "graph_num_splits", lambda *a: 3)
    cfg = SimpleNamespace(num_heads=32, num_kv_heads=8, head_dim=128)
    backend = SimpleNamespace(kv=torch.zeros(2, 1, 1, dtype=pages), page_size=64)
    got = prefill_graphs._bucket_splits(32, 2, cfg, backend, torch.device("cpu"), ape, q_dtype)
    assert got == ((7, False) if hopper else (3, True))
    assert prefill_hopper.takes_dtypes(q_dtype, pages) == (hopper or ape)


def hopper_rule(monkeypatch):
    """The Hopper kernel's shape rule as on an H200 (questions of at most MAX_QUESTION rows), with fixed split
    counts: 7 for its graphs, 3 (planned) for prefill.py's."""
    from lazyattn.engine import prefill_graphs
    from lazyattn.kernels import prefill_hopper

    monkeypatch.setattr(prefill_hopper, "shape_supported", lambda max_q, *rest: max_q <= 256)
    monkeypatch.setattr(prefill_hopper, "takes_layout", lambda cache: True)
    monkeypatch.setattr(prefill_hopper, "num_splits", lambda *a, **k: 7)
    monkeypatch.setattr(prefill_graphs, "graph_num_splits", lambda *a: 3)


@pytest.mark.parametrize(
    ("q_dtype", "ape", "short"),
    [(torch.bfloat16, False, True), (torch.float32, False, False), (torch.bfloat16, True, False)],
)
def test_buckets_past_the_longest_question_get_a_graph_for_short_questions(monkeypatch, q_dtype, ape, short):
    """Buckets of up to 256 tokens: one graph each, the Hopper kernel's. A 512-token bucket: prefill.py's graph for
    any step, and a second, the Hopper kernel's, for steps of short questions, only where that kernel takes the
    model's calls (a 16-bit model, no temperature tables)."""
    from types import SimpleNamespace

    from lazyattn.engine.prefill_graphs import bucket_choices

    hopper_rule(monkeypatch)
    cfg = SimpleNamespace(num_heads=32, num_kv_heads=8, head_dim=128)
    backend = SimpleNamespace(kv=torch.zeros(2, 1, 1, dtype=torch.bfloat16), page_size=64)
    got = bucket_choices((256, 512), (2, 4), cfg, backend, torch.device("cpu"), ape, q_dtype)
    hopper = (7, False) if q_dtype == torch.bfloat16 and not ape else (3, True)
    want = {(256, 2, 256): hopper, (256, 4, 256): hopper, (512, 2, 512): (3, True), (512, 4, 512): (3, True)}
    if short:
        want |= {(512, 2, 256): (7, False), (512, 4, 256): (7, False)}
    assert got == want


def test_a_step_of_short_questions_replays_the_short_graph(monkeypatch):
    """The longest entry, the padding entry's rows included, picks the graph: at most 256 rows each -> the Hopper
    kernel's graph of the bucket; a longer prompt, or a bucket without that graph -> the one for any step."""
    from types import SimpleNamespace

    from lazyattn.engine.prefill_graphs import PrefillGraphs

    def question(n):
        return (EntryPages([0], [0], [16]), [1] * n, 0, [-1] * n, True)

    graphs = SimpleNamespace(ape=False, width=WIDTH, token_buckets=(256, 512), entry_buckets=(2, 16))
    graphs.splits = {(256, 2, 256): 7, (512, 2, 512): 3, (512, 16, 512): 3, (512, 16, 256): 7}
    pick = functools.partial(PrefillGraphs.bucket, graphs)
    assert pick(step_of([question(32)] * 12)) == (512, 16, 256)  # 384 rows: 128 of padding
    assert pick(step_of([question(32)] * 8 + [question(200)])) == (512, 16, 256)
    assert pick(step_of([question(257), question(10)])) == (512, 16, 512)  # a prompt past 256 rows
    assert pick(step_of([question(200), question(60)])) == (512, 16, 256)  # 260 rows: 252 of padding
    assert pick(step_of([question(130), question(130)])) == (512, 16, 256)
    assert pick(step_of([question(300)])) == (512, 2, 512)  # no short graph for (512, 2)
    assert pick(step_of([question(100)])) == (256, 2, 256)

    def over_documents(n, shifted):  # n rows over `shifted` keys at a nonzero delta, then 16 of its own
        return (EntryPages([0, 1], [9, 0], [shifted, 16]), [1] * n, shifted, [-1] * n, True)

    assert pick(step_of([over_documents(300, 300), question(32)])) == (512, 16, 256)  # a question past 256 rows
    assert pick(step_of([over_documents(300, 299), question(32)])) == (512, 16, 512)  # too few shifted keys
    assert pick(step_of([over_documents(400, 500)])) == (512, 2, 512)  # no short graph for (512, 2)


@given(
    q_lens=st.lists(st.integers(1, 300), min_size=1, max_size=70),
    documents=st.lists(st.booleans(), min_size=70, max_size=70),
    short_graphs=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_the_graph_a_step_replays_allows_every_entry_it_holds(q_lens, documents, short_graphs):
    """For any step: the graph picked holds its tokens and entries (the padding entry too), every entry, the padding
    one included, fits the longest entry that graph allows or (the graph for short questions) is a question over
    placed documents, and a step that fits a bucket's graph for short questions (where it exists) is never given the
    other."""
    from types import SimpleNamespace

    from lazyattn.engine.prefill_graphs import TOKEN_BUCKETS, PrefillGraphs, bucket_choices
    from lazyattn.kernels import prefill_hopper

    cfg = SimpleNamespace(num_heads=32, num_kv_heads=8, head_dim=128)
    backend = SimpleNamespace(kv=torch.zeros(2, 1, 1, dtype=torch.bfloat16), page_size=64)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(prefill_hopper, "shape_supported", lambda max_q, *rest: short_graphs and max_q <= 256)
        m.setattr(prefill_hopper, "takes_layout", lambda cache: True)
        m.setattr(prefill_hopper, "num_splits", lambda *a, **k: 7)
        choices = bucket_choices(TOKEN_BUCKETS, ENTRY_BUCKETS, cfg, backend, torch.device("cpu"))
    graphs = SimpleNamespace(ape=False, width=WIDTH, token_buckets=TOKEN_BUCKETS, entry_buckets=ENTRY_BUCKETS)
    graphs.splits = {key: splits for key, (splits, _) in choices.items()}
    # an entry over documents reads as many keys at a nonzero delta as it has rows, the others none
    shifted = [n if over else 0 for n, over in zip(q_lens, documents)]
    step = step_of([(EntryPages([0, 1], [9, 0], [k, 16]), [1] * n, k, [-1] * n, True) for n, k in zip(q_lens, shifted)])
    prompts = [n for n, k in zip(q_lens, shifted) if k < n]
    picked = PrefillGraphs.bucket(graphs, step)
    total = sum(q_lens)
    if picked is None:
        assert pick_bucket(step, WIDTH) is None
        return
    tokens, entries, longest = picked
    assert picked in graphs.splits and (tokens, entries) == pick_bucket(step, WIDTH)
    assert tokens >= total and entries >= len(q_lens) + 1
    assert longest >= max(*prompts, tokens - total, 0)
    if tokens <= 256:  # one graph per bucket
        assert longest == tokens
        return
    short = (tokens, entries, prefill_hopper.MAX_QUESTION)
    assert (short in graphs.splits) == short_graphs
    assert (picked == short) == (short_graphs and max(*prompts, tokens - total, 0) <= 256)
