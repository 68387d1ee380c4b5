"""What a large heap costs a test through Python's cyclic collector, and what gc.freeze gives back: the real-engine
ci search of tests/test_fuzz_transformers.py (transformers, seed 0, the ci profile, empty prompts off), each run in a
fresh process, one after the other, the engine and its tiny model loaded first: nothing frozen (the target before
72a5152); beside a heap of N objects (a test worker's state after hundreds of tests), nothing frozen; beside the
same heap, frozen after a collection (what tests/conftest.py does before every test); frozen (what the target's
`tiny_model` does since 72a5152). transformers' manager calls `gc.collect()` as it stops (and its batch processor
as it is deleted), once or more per example, and each walks every object not frozen.

    .venv/bin/python bench/gc_heap.py --objects 1200000

Prints a row per run: seconds, full collections during the search, and the ratio to the first run.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _search(objects: int, frozen: bool) -> tuple[float, int, str]:
    from schedproof.fuzz import fuzz
    from targets.stateful import PROFILES
    from targets.transformers_cb import tiny_model

    tiny_model()        # torch, transformers and the model: in the suite an earlier test has loaded them
    gc.unfreeze()       # tiny_model froze them: every run starts with nothing frozen
    heap = [[i, str(i)] for i in range(objects)]     # live for the whole search, like a worker's caches
    if frozen:
        gc.collect()
        gc.freeze()
    full = [0]
    gc.callbacks.append(lambda phase, info: full.__setitem__(0, full[0] + (phase == "stop" and info["generation"] == 2)))
    ci = PROFILES["ci"]
    start = time.monotonic()
    result = fuzz("transformers", examples=ci["examples"], seed=0, steps=ci["steps"], empty_prompts=False)
    seconds = time.monotonic() - start
    del heap
    return seconds, full[0], f"{result.status} {result.property}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_200_000, help="the heap's size, in small lists")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    print("| run | s | full collections | verdict | ratio to the first |\n|---|---|---|---|---|")
    first = None
    for label, objects, frozen in (("nothing frozen", 0, False),
                                   (f"beside {args.objects:,} objects, nothing frozen", args.objects, False),
                                   (f"beside {args.objects:,} objects, frozen", args.objects, True),
                                   ("frozen", 0, True)):
        with context.Pool(1) as pool:
            seconds, full, verdict = pool.apply(_search, (objects, frozen))
        first = first or seconds
        print(f"| {label} | {seconds:.1f} | {full} | {verdict} | {seconds / first:.2f} |", flush=True)


if __name__ == "__main__":
    main()
