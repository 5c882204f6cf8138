"""A lone batch on the GPU as a request gets it, and its host part apart from its device part.

`python -P tests/bench/bench_lone_step.py --label new` on a CUDA machine. For each model (real
configs in tests/bench/configs, random bf16 weights) and each batch shape, from an idle device:
- `step`: one engine step, `engine.step(engine.pack(...)).wait()`, as `bench_gpu.py`'s latency
  suite times it (pack, stage, copy in, replay, copy out, the waiter's wake-up);
- `served`: one request of that batch through the worker's scheduler on an event loop (uvloop where
  installed, as the worker runs): admission, the queue, pack, launch, the wait the scheduler chooses
  for it, the rows delivered: what a request gets from the worker past its data port; with the
  batch's stages as the scheduler's hooks report them (pack, launch, device, resume) and the rest
  (admission, the queue's turn, delivery);
- `pack` and `launch`: the host part, the pack and the step's own CPU time until it returns;
- `device`: the device part, steps of that batch back to back (two in flight) over CUDA timing
  events, divided by their number;
- per model, 16 closed-loop clients of the first shape through the scheduler (requests/s and the
  process's CPU a request: what a busy worker spends on completions), then the process's CPU over
  a second of an idle loop.
The script imports only the engine, its config and the scheduler, as every tree since the folders
became layers has them, so two trees can be timed side by side, each `kembed` on its own PYTHONPATH:
`--turns DIR --order a,b --label a` makes the processes take turns round by round (each waits for
its label in DIR/turn, runs one round, passes the turn on), the models built once per process.
Writes one JSON line per shape and round to `--json` and prints a table of the rounds;
`--summarize FILE` prints such a file's figures, each the median round (the worst in brackets).
"""

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine

try:
    from kembed.worker.hooks import SchedulerHooks
    from kembed.worker.scheduling.scheduler import Scheduler
except ImportError:  # a tree from before the scheduling layer
    from kembed.worker.scheduler import Scheduler, SchedulerHooks  # type: ignore[no-redef]

STAGES = ("pack", "launch", "device", "resume")  # SchedulerHooks.batch_stages' order


CONFIGS = Path(__file__).resolve().parent / "configs"


def write_model_dir(name: str, tmp: Path) -> Path:
    """A model directory of config `name` with random bf16 weights."""
    config = transformers.AutoConfig.from_pretrained(CONFIGS / name)
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = transformers.AutoModel.from_config(config, dtype=torch.bfloat16)
    path = tmp / name
    model.save_pretrained(path)
    for extra in ("modules.json", "1_Pooling"):
        if (CONFIGS / name / extra).is_dir():
            shutil.copytree(CONFIGS / name / extra, path / extra)
        elif (CONFIGS / name / extra).exists():
            shutil.copy(CONFIGS / name / extra, path / extra)
    return path


def build(path: Path, backend: str):
    config = WorkerConfig(
        model=path, device="cuda", dtype="bfloat16", max_batch_tokens=16384, attention_backend=backend
    )
    return load_engine(config)


def p50_p99(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def shape(text: str) -> tuple[int, int]:
    num_seqs, _, length = text.partition("x")
    return int(num_seqs), int(length)


def time_steps(engine, ids, lengths, iters: int) -> dict[str, list[float]]:
    """ms of each step from an idle device, and of its pack and launch (host) parts."""
    out: dict[str, list[float]] = {"step": [], "pack": [], "launch": []}
    for _ in range(iters):
        torch.cuda.synchronize()
        started = time.perf_counter()
        packed = engine.pack(ids, lengths)
        packed_at = time.perf_counter()
        pending = engine.step(packed)
        launched_at = time.perf_counter()
        pending.wait()
        done = time.perf_counter()
        out["step"].append((done - started) * 1e3)
        out["pack"].append((packed_at - started) * 1e3)
        out["launch"].append((launched_at - packed_at) * 1e3)
    return out


def device_ms(engine, ids, lengths, num_steps: int) -> float:
    """ms of device time a step: `num_steps` back to back, two in flight, between timing events."""
    packed = [engine.pack(ids, lengths) for _ in range(2)]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream = getattr(engine, "stream", None) or torch.cuda.current_stream()
    start.record(stream)
    pending = [engine.step(packed[0])]
    for i in range(1, num_steps):
        pending.append(engine.step(packed[i % 2]))
        pending.pop(0).wait()
    end.record(stream)
    pending.pop(0).wait()
    end.synchronize()
    return start.elapsed_time(end) / num_steps


async def time_served(scheduler, stages: list, ids, lengths, iters: int) -> tuple[list[float], dict]:
    """ms of each request, and the median of each batch stage the scheduler reported (its hooks:
    pack, launch, device, resume) with `queue+deliver`, what the request took beyond its batch."""
    out, stages[:] = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        started = time.perf_counter()
        await scheduler.submit(ids, lengths)
        out.append((time.perf_counter() - started) * 1e3)
    medians = {f"served_{n}": statistics.median(s[i] for s in stages) * 1e3 for i, n in enumerate(STAGES)}
    beyond = [ms - sum(s) * 1e3 for ms, s in zip(out, stages, strict=True)]
    medians["served_queue_deliver"] = statistics.median(beyond)
    return out, medians


async def time_busy(scheduler, ids, lengths, num_clients: int, num_requests: int) -> tuple[float, float]:
    """(requests/s, process CPU µs a request) of `num_clients` closed-loop clients of one query each."""
    left = [num_requests]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            await scheduler.submit(ids, lengths)

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(num_clients)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return num_requests / wall, cpu / num_requests * 1e6


async def idle_cpu_percent(seconds: float) -> float:
    """The process's CPU, in % of a core, over `seconds` of an idle event loop (the scheduler's idle
    tasks running)."""
    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    return (time.process_time() - cpu) / (time.perf_counter() - started) * 100


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def take_turn(turns: Path | None, order: list[str], label: str, round_: int) -> None:
    """Wait until every process is built and the turn file names this one's round (at most 5 min:
    a process that died passes no turn on)."""
    if turns is None:
        return
    (turns / f"ready-{label}").touch()
    want, deadline = f"{label} {round_}", time.monotonic() + 300
    while (turns / "turn").read_text().strip() != want or not all(
        (turns / f"ready-{other}").exists() for other in order
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"{label}: no turn for round {round_} after 5 min")
        time.sleep(0.01)


def pass_turn(turns: Path | None, order: list[str], label: str, round_: int) -> None:
    if turns is None:
        return
    i = order.index(label)
    following = f"{order[i + 1]} {round_}" if i + 1 < len(order) else f"{order[0]} {round_ + 1}"
    (turns / "turn.tmp").write_text(following)
    (turns / "turn.tmp").replace(turns / "turn")


FIGURES = ("step_p50", "step_p99", "served_p50", "served_p99", "pack_p50", "launch_p50", "device")
SERVED = ("served_pack", "served_launch", "served_device", "served_resume", "served_queue_deliver")


def _cell(values: list[float], unit: str = "{:.3f}", worst=max) -> str:
    return f"{unit.format(statistics.median(values))} ({unit.format(worst(values))})"


def print_table(rows: list[dict]) -> None:
    """One row per tree, model and shape of `rows` (rounds): each figure's median round (worst)."""
    busy = [r for r in rows if "busy_rps" in r]
    rows = [r for r in rows if "busy_rps" not in r]
    if busy:
        print("| model | load | tree | requests/s | CPU µs a request | idle CPU % of a core | rounds |")
        print("|---|---|---|---:|---:|---:|---:|")
        for model, text, label in dict.fromkeys((r["model"], r["shape"], r["label"]) for r in busy):
            mine = [r for r in busy if (r["model"], r["shape"], r["label"]) == (model, text, label)]
            cells = (
                _cell([r["busy_rps"] for r in mine], "{:.0f}", worst=min),
                _cell([r["busy_cpu_us"] for r in mine], "{:.0f}"),
                _cell([r["idle_cpu_pct"] for r in mine], "{:.2f}"),
            )
            print(f"| {model} | {text} | {label} | " + " | ".join(cells) + f" | {len(mine)} |")
        print()
    keys = list(dict.fromkeys((r["model"], r["shape"], r["label"]) for r in rows))
    print("| model | batch | tree | " + " | ".join(f.replace("_", " ") for f in FIGURES) + " | rounds |")
    print("|---|---|---|" + "---:|" * (len(FIGURES) + 1))
    for model, text, label in sorted(keys, key=lambda k: (k[0], keys.index(k))):
        mine = [r for r in rows if (r["model"], r["shape"], r["label"]) == (model, text, label)]
        cells = [_cell([r[f] for r in mine]) for f in FIGURES]
        print(f"| {model} | {text} | {label} | " + " | ".join(cells) + f" | {len(mine)} |")
    print("\nA request's batch stages, as the scheduler timed them (ms, median request of each round):\n")
    print("| model | batch | tree | " + " | ".join(f.removeprefix("served_") for f in SERVED) + " |")
    print("|---|---|---|" + "---:|" * len(SERVED))
    for model, text, label in sorted(keys, key=lambda k: (k[0], keys.index(k))):
        mine = [r for r in rows if (r["model"], r["shape"], r["label"]) == (model, text, label)]
        cells = [_cell([r[f] for r in mine]) for f in SERVED]
        print(f"| {model} | {text} | {label} | " + " | ".join(cells) + " |")


def summarize(path: Path) -> None:
    print_table([json.loads(line) for line in path.read_text().splitlines() if line.strip()])


def main() -> None:
    if sys.argv[1:2] == ["--summarize"]:
        summarize(Path(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--models", nargs="+", default=["bge-m3", "qwen3-0.6b"])
    parser.add_argument("--shapes", nargs="+", default=["1x128", "1x512", "1x16", "8x16", "16x16", "64x16"])
    parser.add_argument("--iters", type=int, default=200, help="timed steps per shape and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--turns", type=Path, help="a folder whose `turn` file says whose round it is")
    parser.add_argument("--order", default="", help="comma-separated labels, in turn order")
    parser.add_argument("--json", type=Path, help="append one JSON line per round here")
    args = parser.parse_args()
    order = args.order.split(",") if args.order else [args.label]
    rng = np.random.default_rng(0)
    loop = new_loop()
    asyncio.set_event_loop(loop)
    setups = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = write_model_dir(name, Path(tmp))
            torch.cuda.empty_cache()
            engine = build(path, args.backend)
            batches = {}
            for text in args.shapes:
                num_seqs, length = shape(text)
                seqs = rng.integers(5, engine.info.vocab_size, (num_seqs, length))
                ids, lengths = seqs.reshape(-1).astype(np.int32), np.full(num_seqs, length, np.int32)
                engine.prewarm([engine.pack(ids, lengths).bucket])
                time_steps(engine, ids, lengths, 10)
                batches[text] = (ids, lengths)

            stages: list[tuple[float, ...]] = []

            async def start(engine=engine, stages=stages):
                hooks = SchedulerHooks(batch_stages=lambda *seconds: stages.append(seconds))
                scheduler = Scheduler(engine, max_batch_tokens=16384, max_queued_tokens=1 << 30, hooks=hooks)
                scheduler.start()
                return scheduler

            scheduler = loop.run_until_complete(start())
            for ids, lengths in batches.values():
                loop.run_until_complete(time_served(scheduler, stages, ids, lengths, 10))
            setups.append((name, engine, scheduler, batches, stages))
        backends = [setup[1].info.attention_backend for setup in setups]
        print(
            f"{args.label}: {torch.cuda.get_device_name()}, torch {torch.__version__}, {backends}", flush=True
        )
        rows = []
        for round_ in range(args.rounds):
            take_turn(args.turns, order, args.label, round_)
            for name, engine, scheduler, batches, stages in setups:
                for text, (ids, lengths) in batches.items():
                    parts = time_steps(engine, ids, lengths, args.iters)
                    timed = time_served(scheduler, stages, ids, lengths, args.iters)
                    served, served_stages = loop.run_until_complete(timed)
                    device = device_ms(engine, ids, lengths, 100)
                    step_p50, step_p99 = p50_p99(parts["step"])
                    served_p50, served_p99 = p50_p99(served)
                    row = {
                        "label": args.label, "round": round_, "model": name, "shape": text,
                        "step_p50": step_p50, "step_p99": step_p99, "served_p50": served_p50,
                        "served_p99": served_p99, "pack_p50": statistics.median(parts["pack"]),
                        "launch_p50": statistics.median(parts["launch"]), "device": device,
                        **served_stages,
                    }  # fmt: skip
                    rows.append(row)
                    if args.json is not None:
                        with args.json.open("a") as out:
                            out.write(json.dumps(row) + "\n")
            for name, _, scheduler, batches, _ in setups:
                ids, lengths = batches[args.shapes[0]]
                clients = time_busy(scheduler, ids, lengths, 16, 20 * args.iters)
                rps, cpu_us = loop.run_until_complete(clients)
                idle = loop.run_until_complete(idle_cpu_percent(1.0))
                load = f"16 clients of {args.shapes[0]}"
                busy = {"label": args.label, "round": round_, "model": name, "shape": load,
                        "busy_rps": rps, "busy_cpu_us": cpu_us, "idle_cpu_pct": idle}  # fmt: skip
                print(json.dumps(busy), flush=True)
                if args.json is not None:
                    with args.json.open("a") as out:
                        out.write(json.dumps(busy) + "\n")
            pass_turn(args.turns, order, args.label, round_)
        for setup in setups:
            loop.run_until_complete(setup[2].close())
    print_table(rows)


if __name__ == "__main__":
    main()
