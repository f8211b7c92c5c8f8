"""The sweep of ``time_to_best.py``: every (N, chunks, policy) measured in turn, its figures
printed, a summary table, the JSON and the exit status. ``bench`` is ``time_to_best.py``
itself (the workload helpers); the sides, the timers and the peers are its siblings.
"""

from __future__ import annotations

import math
import shutil
import time
from types import ModuleType
from typing import Any


def _setup(bench: ModuleType, args: Any, n: int, chunks: int, model: str, train: Any,
           evals: Any, eval_strategy: str) -> dict[str, Any]:
    from trl_rapidfire.engine.chunks import plan_chunks

    steps = math.ceil(args.rows / bench.BATCH_SIZE)
    return dict(model=model, train=train, evals=evals, lrs=bench.learning_rates(n), configs=n,
                chunks=chunks, steps=steps, rows=args.rows,
                chunk_steps=plan_chunks(steps, steps, chunks).boundaries[0],
                eval_strategy=eval_strategy, report_to=args.report_to, eta=args.eta,
                lr_min=bench.LR_MIN, lr_max=bench.LR_MAX, threads=args.threads,
                optuna_concurrent=bench.OPTUNA_CONCURRENT)


def available(policies: list[str], sides: ModuleType, setup: dict[str, Any]) -> list[str]:
    kept = []
    for name in policies:
        try:
            sides.build_policy(name, setup)
        except sides.Unavailable as err:
            print(f"{err}: skipping that policy", flush=True)
            continue
        kept.append(name)
    return kept


def measure(bench: ModuleType, sides: ModuleType, parts: ModuleType, setup: dict[str, Any],
            policy: str, args: Any, work: str) -> dict[str, Any]:
    """One (N, chunks, policy): ``--repeats`` pairs RF then baseline, each side's best kept."""
    n, chunks = setup["configs"], setup["chunks"]
    rf_best = base_best = None
    rates: list[float] | None = None
    winners: list[tuple[float, float | None]] = []  # each RF repetition's (lr, final loss)
    for rep in range(args.repeats):
        folder = f"{work}/{n}-{chunks}-{policy}-{rep}"
        with bench.warnings_off():
            rf = sides.run_rapidfire(bench, setup, policy, f"{folder}/rf", parts)
            # No run completed: no winner, and the exactness check fails for it.
            winners.append((rf.best.learning_rate, rf.best.eval_loss) if rf.best is not None
                           else (math.nan, None))
            if rates is None:
                rates = sides.sample_rates(setup["lrs"], args.baseline_sample,
                                           [w for w, _ in winners[:1] if not math.isnan(w)])
            base = sides.run_baseline(bench, setup, rates, f"{folder}/baseline", parts)
        shutil.rmtree(folder, ignore_errors=True)
        scaled = base.total * n / len(rates)
        print(f"  repetition {rep + 1}/{args.repeats}: RF {rf.wall:.1f} s "
              f"({rf.chunks_trained} chunks); baseline sample {len(rates)} configs "
              f"{base.total:.1f} s -> scaled to {n}: {scaled:.1f} s", flush=True)
        rf_best = rf if rf_best is None or rf.wall < rf_best.wall else rf_best
        base_best = base if base_best is None or base.total < base_best.total else base_best
    alone = {c.learning_rate: c.eval_loss for c in base_best.configs}
    missing = sorted({lr for lr, _ in winners if lr not in alone and not math.isnan(lr)})
    if missing:  # a later repetition picked another winner: trained alone, untimed
        with bench.warnings_off():
            extra = sides.run_baseline(bench, setup, missing, f"{work}/extra", parts)
        shutil.rmtree(f"{work}/extra", ignore_errors=True)
        alone.update({c.learning_rate: c.eval_loss for c in extra.configs})
    return figures(bench, setup, policy, rf_best, base_best, rates, winners, alone)


def figures(bench: ModuleType, setup: dict[str, Any], policy: str, rf: Any, base: Any,
            rates: list[float], winners: list[tuple[float, float | None]],
            alone: dict[float, float | None]) -> dict[str, Any]:
    n, chunks = setup["configs"], setup["chunks"]
    full = n * chunks
    scaled = base.total * n / len(rates)
    ratio = scaled / rf.wall
    bound = full / rf.chunks_trained if rf.chunks_trained else math.nan
    halving = full / bench.halving_work(n, chunks, setup["eta"])
    b_best = base.best()
    gap = (rf.best.eval_loss - b_best.eval_loss
           if rf.best is not None and b_best is not None else None)
    checks = [{"learning_rate": lr, "rf": loss, "alone": alone.get(lr),
               "equal": loss is not None and loss == alone.get(lr)} for lr, loss in winners]
    per_config = base.total / len(rates)
    return {
        "configs": n, "chunks": chunks, "policy": policy, "steps": setup["steps"],
        "chunk_steps": setup["chunk_steps"], "eval_strategy": setup["eval_strategy"],
        "report_to": setup["report_to"],
        "baseline": {"scaled_seconds": scaled, "sample": len(rates), "sample_seconds": base.total,
                     "scaled": len(rates) < n, "per_config_seconds": per_config,
                     "per_config_build_seconds": sum(c.build for c in base.configs) / len(rates),
                     "parts": base.parts, "configs": base.configs},
        "rf": {"seconds": rf.wall, "construct_seconds": rf.construct,
               "train_seconds": rf.train, "chunks_trained": rf.chunks_trained,
               "first_metric_seconds": rf.first_metric, "time_to_best_seconds": rf.time_to_best,
               "best": rf.best, "runs": rf.runs, "parts": rf.parts},
        "ratio": ratio, "work_bound": bound, "halving_bound": halving,
        "bound_reached": ratio / bound if bound else None,
        # What a chunk costs with everything on (its steps, evaluation where due, the policy,
        # the turn, MLflow's writes): train()'s wall over the chunks trained.
        "per_chunk_seconds": rf.train / rf.chunks_trained if rf.chunks_trained else math.nan,
        "halving_bound_reached": ratio / halving,
        "baseline_first_metric_seconds": per_config,
        "quality": {"rf_best": rf.best, "baseline_best": b_best, "gap": gap},
        "exactness": checks, "exact": bool(checks) and all(c["equal"] for c in checks),
    }


def print_figures(f: dict[str, Any], parts: ModuleType) -> None:
    b, r, q = f["baseline"], f["rf"], f["quality"]
    n = f["configs"]
    how = (f"SCALED: {b['sample']} of {n} configs trained, {b['sample_seconds']:.1f} s x "
           f"{n}/{b['sample']}" if b["scaled"] else f"all {n} configs trained, not scaled")
    print(f"  baseline, plain TRL one config after another ({how}): "
          f"{b['scaled_seconds']:8.1f} s")
    parts.print_baseline(b["parts"], b["sample"])
    print(f"  rapidfire, construct + train() until it returns: {r['seconds']:8.1f} s "
          f"(construct {r['construct_seconds']:.1f} s + train() {r['train_seconds']:.1f} s)")
    print(f"  ratio baseline / RF: {f['ratio']:.2f}x")
    print(f"  work bound: {n * f['chunks']} chunks (baseline) / {r['chunks_trained']} trained "
          f"by RF = {f['work_bound']:.2f}x (successive halving's halving_work: "
          f"{f['halving_bound']:.2f}x); reached {f['bound_reached']:.2f} of it "
          f"({f['halving_bound_reached']:.2f} of halving's)")
    print(f"  per chunk trained: {1e3 * f['per_chunk_seconds']:.1f} ms (train() "
          f"{r['train_seconds']:.2f} s / {r['chunks_trained']} chunks; everything on)")
    first = r["first_metric_seconds"]
    print(f"  first metric: RF {first:.2f} s after construction began (the first chunk's end); "
          f"the baseline's first after {f['baseline_first_metric_seconds']:.2f} s (one config)"
          if first is not None else "  first metric: RF trained no chunk")
    best, base_best = q["rf_best"], q["baseline_best"]
    if best is not None and r["time_to_best_seconds"] is not None:
        print(f"  time to RF's best: {r['time_to_best_seconds']:.2f} s (lr {best.learning_rate:.3g}"
              f", {best.chunks} chunks)")
    if best is not None and base_best is not None:
        print(f"  quality: RF best eval_loss {best.eval_loss:.4f} (lr {best.learning_rate:.3g}) "
              f"vs the best sampled baseline {base_best.eval_loss:.4f} (lr "
              f"{base_best.learning_rate:.3g}): gap {q['gap']:+.4f}")
    seen: dict[tuple[float, Any], int] = {}
    for c in f["exactness"]:  # one line per distinct winner (each repetition has one)
        seen[(c["learning_rate"], c["rf"])] = seen.get((c["learning_rate"], c["rf"]), 0) + 1
    for c in f["exactness"]:
        times = seen.pop((c["learning_rate"], c["rf"]), 0)
        if not times:
            continue
        print(f"  exactness: RF winner's final eval_loss {'==' if c['equal'] else '!='} the "
              f"same config trained alone by plain TRL (lr {c['learning_rate']:.6g}: "
              f"{c['rf']!r} vs {c['alone']!r}; {times} of {len(f['exactness'])} "
              f"repetition(s)): {'ok' if c['equal'] else 'FAILED'}")
    if not f["exactness"]:
        print("  exactness: FAILED (no RF run completed)")
    parts.print_breakdown(r["parts"])


def print_summary(results: list[dict[str, Any]]) -> None:
    print("\nsummary (baseline SCALED from its sample to N; each side's best repetition):")
    print(f"  {'N':>4} {'chunks':>6} {'policy':<9} | {'baseline s':>10} {'RF s':>8} "
          f"{'ratio':>6} | {'bound':>6} {'reached':>7} | {'1st metric s':>12} | "
          f"{'ms/chunk':>8} | {'gap':>8} | exact")
    print("  " + "-" * 109)
    for f in results:
        gap = f["quality"]["gap"]
        first = f["rf"]["first_metric_seconds"]
        print(f"  {f['configs']:4d} {f['chunks']:6d} {f['policy']:<9} | "
              f"{f['baseline']['scaled_seconds']:10.1f} {f['rf']['seconds']:8.1f} "
              f"{f['ratio']:5.2f}x | {f['work_bound']:5.2f}x {f['bound_reached']:7.2f} | "
              f"{first if first is not None else float('nan'):12.2f} | "
              f"{1e3 * f.get('per_chunk_seconds', math.nan):8.1f} | "
              f"{gap if gap is not None else float('nan'):+8.4f} | "
              f"{'yes' if f['exact'] else 'NO'}")
    # A chunk's cost as the configs grow (same chunks and policy): the target is flat.
    shapes: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for f in results:
        shapes.setdefault((f["chunks"], f["policy"]), []).append(f)
    for (chunks, policy), same in shapes.items():
        if len(same) > 1:
            low, high = min(same, key=lambda f: f["configs"]), max(same, key=lambda f: f["configs"])
            print(f"  per chunk, {chunks} chunks, {policy}: N={high['configs']} / "
                  f"N={low['configs']} = {high['per_chunk_seconds'] / low['per_chunk_seconds']:.2f}"
                  f" ({1e3 * high['per_chunk_seconds']:.1f} / "
                  f"{1e3 * low['per_chunk_seconds']:.1f} ms)")


def run(args: Any, bench: ModuleType) -> int:
    from trl_rapidfire.testing import make_sft_dataset, tiny_model_path

    sides, parts = bench.sibling("time_to_best_sides"), bench.sibling("time_to_best_parts")
    model = tiny_model_path()
    train = make_sft_dataset(args.rows, seed=1)
    evals = make_sft_dataset(bench.SWEEP_EVAL_ROWS, seed=9)
    eval_strategy, note = sides.resolve_eval_strategy(bench, args.eval_strategy)
    print(bench.header(args, eval_strategy, note), flush=True)
    probe = _setup(bench, args, args.configs[0], args.chunks[0], model, train, evals,
                   eval_strategy)
    policies = available(list(dict.fromkeys(args.policy)), sides, probe)
    results: list[dict[str, Any]] = []
    all_peers: list[dict[str, Any]] = []
    work = bench.scratch()
    try:
        t = time.perf_counter()
        sides.warm_up(bench, probe, policies, parts)
        parts.wrapper_cost()
        print(f"warm-up (untimed): {time.perf_counter() - t:.1f} s", flush=True)
        for n in args.configs:
            for chunks in args.chunks:
                setup = _setup(bench, args, n, chunks, model, train, evals, eval_strategy)
                mine = {}
                for policy in policies:
                    _, _, _, description = sides.build_policy(policy, setup)
                    print(f"\n== {n} configs x {chunks} chunks ({setup['steps']} steps, "
                          f"{setup['chunk_steps']} a chunk), policy {policy}: {description}; "
                          f"eval_strategy={eval_strategy!r}, report_to={args.report_to!r}",
                          flush=True)
                    f = measure(bench, sides, parts, setup, policy, args, work)
                    print_figures(f, parts)
                    results.append(f)
                    mine[policy] = {"wall": f["rf"]["seconds"],
                                    "time_to_best": f["rf"]["time_to_best_seconds"],
                                    "best_loss": (f["quality"]["rf_best"].eval_loss
                                                  if f["quality"]["rf_best"] else None)}
                if args.peers:
                    peers = bench.sibling("time_to_best_peers")
                    print(f"\n== peers: {n} configs x {chunks} chunks", flush=True)
                    outcomes = peers.run_peers(bench, setup, work, args.peer_timeout, sides)
                    peers.print_peers(outcomes, mine, setup)
                    all_peers.append({"configs": n, "chunks": chunks, "peers": outcomes,
                                      "rf": mine})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if results:
        print_summary(results)
    else:
        print("no policy could run: nothing was measured")
    exact = bool(results) and all(f["exact"] for f in results)
    print(f"\nexactness: {'every' if exact else 'NOT every'} RF winner's final eval_loss equals "
          f"its config trained alone by plain TRL ({sum(f['exact'] for f in results)}/"
          f"{len(results)} shapes)")
    if args.json:
        bench.write_json(args.json, {
            "mode": "time_to_best", "threads": args.threads, "rows": args.rows,
            "eval_rows": bench.SWEEP_EVAL_ROWS, "eval_strategy_asked": args.eval_strategy,
            "eval_strategy_used": eval_strategy, "eval_strategy_note": note,
            "report_to": args.report_to, "repeats": args.repeats,
            "baseline_sample": args.baseline_sample, "policies_asked": args.policy,
            "policies_run": policies, "wrapper_cost_seconds": parts.wrapper_cost(),
            "results": results, "peers": all_peers, "exact": exact})
    return 0 if exact else 1
