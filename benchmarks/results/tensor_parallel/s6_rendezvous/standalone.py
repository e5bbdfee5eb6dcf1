"""The bf16 TP test's first engine, outside pytest, with variants: what makes the symmetric-memory rendezvous hang,
and how long the shutdown takes with each way of leaving the group."""
import argparse
import faulthandler
import logging
import sys
import time

import torch

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda-first", action="store_true")
    ap.add_argument("--count-first", action="store_true")
    ap.add_argument("--faulthandler", action="store_true")
    ap.add_argument("--import-tests", action="store_true")
    ap.add_argument("--leave", default="abort")
    a = ap.parse_args()
    print("variant", vars(a), flush=True)
    if a.count_first:
        print("cuda available", torch.cuda.is_available(), torch.cuda.device_count(), flush=True)
    if a.cuda_first:
        torch.zeros(1, device="cuda")
    if a.faulthandler:
        faulthandler.enable()
    if a.import_tests:
        import tests.parallel.test_tensor_parallel_gpu  # noqa
    import torch.distributed as dist

    import lazyattn.parallel.driver as drv
    from lazyattn import LLM, SamplingParams
    if a.leave == "destroy":
        drv.leave = lambda: dist.destroy_process_group()
    elif a.leave == "none":
        drv.leave = lambda: None
    elif a.leave == "sync_abort":
        def _l():
            torch.cuda.synchronize()
            dist.distributed_c10d._abort_process_group()
        drv.leave = _l
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    t = time.time()
    llm = LLM(model="benchmarks/models/llama-3.1-8b", mode="lazy", device="cuda", random_weights=True, kv_cache_gb=8,
              max_num_seqs=4, warm_up=False, progress=False, tensor_parallel_size=2)
    print("started in", round(time.time() - t, 1), "s; path", llm.engine.parallel.tp.all_reduce_path, flush=True)
    from lazyattn.engine.prompt import RenderedPrompt
    llm.engine.add_request("r0", RenderedPrompt(segments=[[128000] + list(range(100, 700))], final=list(range(5, 29))),
                           SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    while llm.engine.has_unfinished():
        for o in llm.engine.step():
            if o.finished:
                print("generated", o.token_ids, flush=True)
    t = time.time()
    llm.shutdown()
    print("shutdown in", round(time.time() - t, 1), "s", flush=True)
