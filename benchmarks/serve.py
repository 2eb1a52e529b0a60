"""The reward server under concurrent load: throughput of 1, 8 and 32 concurrent clients against one client at
a time, latency, the batches formed, errors, and a soak with memory watched.

Starts `rewardlens serve DEMO` as a subprocess (the demo model, the policy monitor on with two fixed random
directions, so start-up fits no concept directions), then drives it from this process with real HTTP
clients on loopback (`http.client`, one keep-alive connection per client thread, `--samples` (prompt,
response) records a request on the native `/score`, each with a trainer step that advances every 2 s, so the
monitor records one step at a time, on its own thread, as it would for a trainer).

Rounds are interleaved (1, 8, 32, 1, 8, 32, ...) for `--reps` repetitions of `--seconds` each, so a busy
stretch of the shared machine slows every concurrency alike; each ratio is the median (and range) of the
per-repetition ratios to the one-client round of the same repetition. Batch sizes come from the server's
own `/metrics` (sequences per forward, the histogram's sum and count across the round). The soak then runs
`--soak` seconds at 8 clients, sampling the server's resident memory (VmRSS) every 5 s.

    python benchmarks/serve.py                     # ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model: Path, work: Path, extra: list[str]) -> tuple[subprocess.Popen, int]:
    import rewardlens as rl

    g = np.random.default_rng(0)
    width = rl.load(model).d_model
    (work / "directions.json").write_text(json.dumps({f"d{j}": g.normal(size=width).tolist() for j in range(2)}))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rewardlens", "serve", str(model), "--port", str(port), "--log",
                             str(work / "policy.jsonl"), "--directions", str(work / "directions.json"), *extra],
                            stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the server did not start")


def metrics(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    out = {}
    for name in ("rewardlens_batch_sequences_sum", "rewardlens_batch_sequences_count"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


T0 = time.monotonic()
STEP_SECONDS = 2.0


def round_(port: int, clients: int, seconds: float, bodies: list[bytes]) -> dict[str, object]:
    """`clients` threads posting for `seconds`: sequences/s, latencies (s), errors, sequences per forward. Each
    request carries a trainer step that advances every `STEP_SECONDS`, so the monitor records a step's samples
    as it would for a trainer (one record per step, on its own thread)."""
    before = metrics(port)
    latencies: list[float] = []
    errors = [0]
    sequences = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        n = 0
        while time.monotonic() < stop:
            step = int((time.monotonic() - T0) / STEP_SECONDS)
            body = bodies[(k + n) % len(bodies)][:-1] + b', "step": %d}' % step
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/score", body=body, headers={"Content-Type": "application/json"})
                answer = conn.getresponse()
                data = answer.read()
                ok = answer.status == 200
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                ok, data = False, b""
            dt = time.perf_counter() - t0
            with lock:
                if ok:
                    latencies.append(dt)
                    sequences[0] += len(json.loads(data)["rewards"])
                else:
                    errors[0] += 1
            n += 1
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = metrics(port)
    forwards = after["rewardlens_batch_sequences_count"] - before["rewardlens_batch_sequences_count"]
    seqs = after["rewardlens_batch_sequences_sum"] - before["rewardlens_batch_sequences_sum"]
    return {"throughput": sequences[0] / wall, "latencies": latencies, "errors": errors[0],
            "batch": seqs / forwards if forwards else float("nan")}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--samples", type=int, default=2, help="records per request")
    parser.add_argument("--soak", type=float, default=120.0)
    parser.add_argument("--server-args", default="--threads 1",
                        help="extra options of `rewardlens serve` (default: one torch thread, one core for HTTP)")
    args = parser.parse_args()

    import tempfile

    from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir

    base = [(p.prompt, r) for p in AUDIT_PAIRS for r in (p.chosen, p.rejected)]
    records = [{"prompt": p, "response": f"{r} ({k})"} for k in range(8) for p, r in base]
    bodies = [json.dumps({"records": records[i:i + args.samples]}).encode()
              for i in range(0, len(records) - args.samples + 1, args.samples)]
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start(demo_model_dir(), Path(tmp), args.server_args.split())
        try:
            round_(port, 8, 2.0, bodies)  # warm-up
            levels = (1, 8, 32)
            runs: dict[int, list[dict[str, object]]] = {c: [] for c in levels}
            for _ in range(args.reps):  # interleaved: a busy stretch slows every level alike
                for c in levels:
                    runs[c].append(round_(port, c, args.seconds, bodies))
            print(f"demo model, {args.samples} records a request, {args.reps} interleaved rounds of {args.seconds:g} s "
                  f"per level, {os.cpu_count()} cores (shared machine: other work ran meanwhile)")
            print(f"{'clients':>7} {'seq/s (median)':>15} {'× one client: median [range]':>30} {'p50 ms':>7} "
                  f"{'p99 ms':>7} {'seqs/forward':>13} {'errors':>6}")
            for c in levels:
                thr = np.array([float(r["throughput"]) for r in runs[c]])  # type: ignore[arg-type]
                ratio = thr / np.array([float(r["throughput"]) for r in runs[1]])  # type: ignore[arg-type]
                lat = np.concatenate([np.asarray(r["latencies"]) for r in runs[c]]) * 1000
                batch = np.median([float(r["batch"]) for r in runs[c]])  # type: ignore[arg-type]
                errors = sum(int(r["errors"]) for r in runs[c])  # type: ignore[call-overload]
                print(f"{c:>7} {np.median(thr):>15.1f} {np.median(ratio):>14.2f}× [{ratio.min():.2f}–{ratio.max():.2f}]"
                      f"{'':>6} {np.percentile(lat, 50):>7.1f} {np.percentile(lat, 99):>7.1f} {batch:>13.1f} "
                      f"{errors:>6}")
            samples: list[tuple[float, int]] = []
            stop = threading.Event()

            def watch() -> None:
                t0 = time.monotonic()
                while not stop.is_set():
                    samples.append((time.monotonic() - t0, rss_kib(proc.pid)))
                    stop.wait(5.0)

            watcher = threading.Thread(target=watch)
            watcher.start()
            soak = round_(port, 8, args.soak, bodies)
            stop.set()
            watcher.join()
            rss = np.array([s[1] for s in samples]) / 1024
            half = rss[len(rss) // 2:]
            t = np.array([s[0] for s in samples])[len(rss) // 2:]
            slope = np.polyfit(t, half, 1)[0] * 60 if len(half) > 1 else float("nan")
            lat = np.asarray(soak["latencies"]) * 1000
            print(f"soak: {args.soak:g} s at 8 clients, {float(soak['throughput']):.1f} seq/s, p50 "  # type: ignore[arg-type]
                  f"{np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms, errors {soak['errors']}; "
                  f"server RSS MiB first {rss[0]:.1f}, last {rss[-1]:.1f}, max {rss.max():.1f}, "
                  f"second-half slope {slope:+.2f} MiB/min ({len(rss)} samples)")
        finally:
            proc.send_signal(signal.SIGTERM)
            print(f"server exit status after SIGTERM: {proc.wait(timeout=120)}")


if __name__ == "__main__":
    main()
