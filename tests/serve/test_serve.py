"""The reward server under load and abuse, in a thread of this process with real HTTP on loopback: each of
32 concurrent callers gets exactly its own rewards (= `model.score`), a burst past the queue gets 503s, every
malformed request of a fuzzed set gets a 4xx while the server keeps serving, a caller that hangs up costs
nothing, and OpenRLHF's protocol round-trips against a client written from its documentation."""

from __future__ import annotations

import json
import random
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rewardlens.serve import read_requests, requests_path
from tests.serve.helpers import get, post, threaded, wait_for

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def conv(prompt, response):
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


def test_32_concurrent_callers_each_get_exactly_their_own_rewards(demo, samples, tmp_path):
    jobs = [samples[i::32][:2] for i in range(32)]  # 32 callers, two distinct samples each
    expected = [demo.score([conv(p, r) for p, r in job]) for job in jobs]  # before the worker shares the model
    with threaded(demo, tmp_path, queue=64) as (port, server):
        server.batcher.hold()  # everyone queues first, so they are batched together whatever the scheduling
        with ThreadPoolExecutor(32) as pool:
            futures = [pool.submit(post, port, "/score", {"records": [{"prompt": p, "response": r} for p, r in job],
                                                          "step": 0}) for job in jobs]
            wait_for(lambda: server.batcher.depth == 32, "32 queued requests")
            server.batcher.release()
            answers = [f.result() for f in futures]
        batches = server.batcher.metrics.batches.n
    for (status, _, body), want in zip(answers, expected):
        assert status == 200, body
        np.testing.assert_allclose(body["rewards"], want, rtol=0, atol=1e-5)
    assert batches < 32, f"32 queued callers took {batches} batched forwards"
    logged = {e.id: e.rewards for e in read_requests(requests_path(tmp_path / "policy.jsonl"))}
    assert all(logged[body["id"]] == tuple(body["rewards"]) for _, _, body in answers)


def test_a_burst_beyond_the_queue_gets_503s_never_a_hang_or_a_wrong_reward(demo, samples, tmp_path):
    expected = {r: float(demo.score([conv(p, r)])[0]) for p, r in samples[:12]}
    with threaded(demo, tmp_path, queue=4) as (port, server):
        server.batcher.hold()
        with ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(post, port, "/score", {"records": [{"prompt": p, "response": r}]})
                       for p, r in samples[:12]]
            wait_for(lambda: sum(f.done() for f in futures) == 8 and server.batcher.depth == 4,
                     "4 queued requests and 8 refusals")
            server.batcher.release()
            answers = [f.result() for f in futures]
    refused = [a for a in answers if a[0] == 503]
    assert len(refused) == 8
    assert all(h.get("retry-after") == "1" and "queue is full" in b["error"] for _, h, b in refused)
    for (status, _, body), (_, r) in zip(answers, samples[:12]):
        if status == 200:
            assert body["rewards"] == pytest.approx([expected[r]], abs=1e-5)


def _malformed(rng: random.Random) -> list[tuple[str, bytes]]:
    """Requests every server must refuse: broken JSON, wrong shapes and types, missing fields, over-long items."""
    good = {"query": ["a text"], "prompts": ["a"]}
    bodies: list[object] = [
        [], "text", 3, None, {}, {"query": "not a list"}, {"query": []}, {"query": [1, 2]}, {"query": [None]},
        {"query": ["x"], "prompts": ["a", "b"]}, {"query": ["x"], "prompts": [3]}, {"query": ["x"], "labels": 3},
        {"query": ["x"], "step": -1}, {"query": ["x"], "step": 1.5}, {"query": ["x"], "step": "one"},
        {"query": ["x"], "step": True}, {"prompts": ["x"]}, {"query": [["nested"]]},
    ]
    native: list[object] = [
        {}, {"records": "x"}, {"records": []}, {"records": [1]}, {"records": [{"prompt": "p"}]},
        {"records": [{"response": "r"}]}, {"records": [{"prompt": 1, "response": "r"}]},
        {"records": [{"prompt": "p", "response": 2}]}, {"records": [{"prompt": [{"role": "user"}], "response": "r"}]},
        {"records": [{"prompt": "p", "response": "r"}], "pairs": []}, {"pairs": "x"}, {"pairs": [{"prompt": "p"}]},
        {"pairs": [{"prompt": "p", "chosen": 1, "rejected": "r"}]}, {"pairs": [3]},
    ]
    out = [("/get_reward", json.dumps(b).encode()) for b in bodies] + [("/score", json.dumps(b).encode())
                                                                       for b in native]
    out += [("/get_reward", b"{"), ("/get_reward", b"\xff\xfe"), ("/score", b"[1,"), ("/get_reward", b""),
            ("/get_reward", b"[" * 100_000 + b"]" * 100_000), ("/score", b'{"records": NaN}')]
    text = json.dumps(good)
    for _ in range(20):  # random byte edits of a good body
        i = rng.randrange(len(text))
        mutated = text[:i] + rng.choice(['"', "}", "[", ",", ":", "\\"]) + text[i + 1:]
        try:
            json.loads(mutated)
        except ValueError:
            out.append(("/get_reward", mutated.encode()))
    out.append(("/get_reward", json.dumps({"query": ["word " * 5000]}).encode()))  # over the sequence limit
    out.append(("/get_reward", json.dumps({"query": ["x"] * 40}).encode()))  # over --max-request-items
    out.append(("/score", b"x" * 70_000))  # over --max-request-bytes
    return out


def test_every_malformed_request_gets_a_4xx_and_the_server_keeps_serving(demo, tmp_path):
    from rewardlens.serve import Limits, Options

    cases = _malformed(random.Random(0))
    want = float(demo.score(["a good text"])[0])
    with threaded(demo, tmp_path, options=Options(Limits(max_bytes=64_000, max_items=32))) as (port, _):
        for path, raw in cases:
            status, _, body = post(port, path, None, raw=raw)
            assert 400 <= status < 500, (path, raw[:80], status, body)
            assert isinstance(body, dict) and "\n" not in body["error"] and body["error"], (path, raw[:80], body)
        status, _, body = post(port, "/get_reward", {"query": ["a good text"]})
    assert status == 200 and body["rewards"] == pytest.approx([want], abs=1e-5)


def test_a_caller_that_hangs_up_costs_nothing_and_breaks_nothing(demo, tmp_path):
    with threaded(demo, tmp_path) as (port, server):
        server.batcher.hold()
        body = json.dumps({"query": ["a text whose caller leaves"], "step": 3}).encode()
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_for(lambda: server.batcher.depth == 1, "the request queued")
        sock.close()
        wait_for(lambda: '"/get_reward",code="499"' in get(port, "/metrics")[1], "the hang-up noticed")
        server.batcher.release()
        wait_for(lambda: server.batcher.metrics.cancelled == 1, "the request dropped")
        status, _, answer = post(port, "/get_reward", {"query": ["a text"]})
        assert status == 200 and answer["rewards"] == pytest.approx(list(map(float, _score(demo, ["a text"]))),
                                                                    abs=1e-5)
        assert server.batcher.metrics.sequences == 1  # the abandoned text never reached the model
    assert [e.rewards for e in read_requests(requests_path(tmp_path / "policy.jsonl"))] == [tuple(answer["rewards"])]


def _score(demo, texts):
    return demo.score(texts)


def test_openrlhf_protocol_round_trips(demo, tmp_path):
    """A client written from OpenRLHF's documented remote-RM protocol (`POST /get_reward` with query = prompt +
    response as decoded by the policy's tokenizer, padding included; `rewards` read back): the rewards are
    `model.score` of the unpadded text, and `scores`/`extra_logs` are there for OpenRLHF's dynamic filtering
    and its logger."""
    from rewardlens.serve import Options

    pad = demo.tokenizer.pad_token
    prompts = ["What is the capital of France?", "Name a prime number."]
    responses = [" The capital of France is Paris.", " Seven is prime."]
    queries = [pad * 3 + p + r + pad * 2 for p, r in zip(prompts, responses)]  # left and right padding
    want = demo.score([p + r for p, r in zip(prompts, responses)])
    want_chat = demo.score([conv(p, r) for p, r in zip(prompts, responses)])
    with threaded(demo, tmp_path) as (port, server):
        status, _, body = post(port, "/get_reward", {"query": queries, "prompts": prompts, "labels": ["", ""]})
        record_count = len(server.monitor.records)
    assert status == 200 and set(body) >= {"rewards", "scores", "extra_logs"}
    np.testing.assert_allclose(body["rewards"], want, rtol=0, atol=1e-5)
    assert body["scores"] == body["rewards"]
    assert all(len(v) == len(queries) for v in body["extra_logs"].values())
    assert record_count == 0  # the step is still gathering
    with threaded(demo, tmp_path / "chat", options=Options(query_as="chat")) as (port, _):
        status, _, body = post(port, "/get_reward", {"query": queries, "prompts": prompts})
        refused = post(port, "/get_reward", {"query": ["no prompt here"], "prompts": ["other"]})
    np.testing.assert_allclose(body["rewards"], want_chat, rtol=0, atol=1e-5)
    assert refused[0] == 422 and "does not start with its prompt" in refused[2]["error"]


def test_pairs_score_as_load_pairs_reads_them_and_the_monitor_rolls_by_step(demo, samples, tmp_path):
    from rewardlens.monitor import PolicyRun
    from rewardlens.zoo import AUDIT_PAIRS

    records = [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in AUDIT_PAIRS[:3]]
    want = demo.score(list(AUDIT_PAIRS[:3]))
    steps = [samples[0:4], samples[4:8], samples[8:12]]
    with threaded(demo, tmp_path) as (port, server):
        status, _, body = post(port, "/score", {"pairs": records})
        for step, chunk in enumerate(steps):
            for half in (chunk[:2], chunk[2:]):  # two workers' requests per step
                post(port, "/score", {"records": [{"prompt": p, "response": r} for p, r in half], "step": step})
        status_alarms, alarms = get(port, "/alarms")
        page = get(port, "/")[1]
    assert status == 200
    np.testing.assert_allclose(body["chosen"], want[0::2], atol=1e-5)
    np.testing.assert_allclose(body["rejected"], want[1::2], atol=1e-5)
    run = PolicyRun.from_jsonl(tmp_path / "policy.jsonl")  # the last step rolled at shutdown
    assert [r.step for r in run.records] == [0, 1, 2] and [len(r.rewards) for r in run.records] == [4, 4, 4]
    for record, chunk in zip(run.records, steps):
        np.testing.assert_allclose(record.rewards, demo.score([conv(p, r) for p, r in chunk]), atol=1e-5)
    assert status_alarms == 200 and [r["step"] for r in json.loads(alarms)["records"]] == [0, 1]
    # the page fetches its own server's data only, and writes it as text, never as markup
    assert "dashboard.json" in page and "innerHTML" not in page and "textContent" in page
    assert "://" not in page.replace("http://www.w3.org/2000/svg", "") and "src=" not in page and "href" not in page


def test_alarms_answer_after_the_monitor_recorded_every_step_already_closed(demo, samples, tmp_path, monkeypatch):
    """The monitor records on its own thread: with each record slowed to 0.5 s, `/alarms` asked right after step 1's
    first sample (which closes step 0) must still hold step 0 — it waits for the record, it does not race it."""
    import time

    from rewardlens.monitor import PolicyMonitor

    slow = PolicyMonitor.observe_read

    def observe_read(self, *args, **kwargs):
        time.sleep(0.5)
        return slow(self, *args, **kwargs)

    monkeypatch.setattr(PolicyMonitor, "observe_read", observe_read)
    with threaded(demo, tmp_path) as (port, _):
        for step, chunk in enumerate((samples[0:4], samples[4:8])):
            post(port, "/score", {"records": [{"prompt": p, "response": r} for p, r in chunk], "step": step})
        status, alarms = get(port, "/alarms")
        data = json.loads(get(port, "/dashboard.json")[1])
    answer = json.loads(alarms)
    assert status == 200 and [r["step"] for r in answer["records"]] == [0] and answer["backlog"] == 0, answer
    assert [r["step"] for r in data["records"]] == [0] and data["backlog"] == 0


def test_a_process_reward_model_is_served_with_model_score_exactly_and_refuses_the_monitor(tmp_path):
    """A PRM reads every step of a sequence: the server scores it as `model.score` does (the one-read loop does
    not apply), and refuses a monitor that splits one read a sequence."""
    import rewardlens as rl
    from rewardlens.errors import UsageError
    from rewardlens.serve import build_server
    from rewardlens.zoo import build_tokenizer
    from tests.model.test_rm_kinds import SEP, build

    tok = build_tokenizer()
    prm = rl.model.wrap_prm(build(tok, "llama", "lm"), tok, separator=SEP, tokens=(23, 29), combine="sum")
    records = [("What is 2+3?", "step one\nstep two"), ("What is 2+3?", "step one\nstep three, maybe")]
    want = prm.score([conv(p, r) for p, r in records])
    with pytest.raises(UsageError, match="--no-monitor"):
        build_server(prm, progress=False)
    with threaded(prm, tmp_path, monitor=False, directions=None) as (port, _):
        status, _, body = post(port, "/score", {"records": [{"prompt": p, "response": r} for p, r in records]})
    assert status == 200, body
    np.testing.assert_allclose(body["rewards"], want, rtol=0, atol=1e-5)


def test_the_client_waits_out_a_full_queue_and_gets_its_own_rewards(demo, tmp_path):
    """`Client` retries a 503 after its Retry-After; a TRL-shaped call through `remote_reward` gets what
    `model.score` gives, at TRL's step."""
    from types import SimpleNamespace

    from rewardlens.serve import Client, remote_reward

    want = demo.score([conv("What is 2+2?", "Four."), conv("Name a colour.", "Blue.")])
    with threaded(demo, tmp_path, queue=1) as (port, server):
        server.batcher.hold()
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(post, port, "/score", {"records": [{"prompt": "What is 2+2?", "response": "Four."}]})
            wait_for(lambda: server.batcher.depth == 1, "the queue full")
            second = pool.submit(remote_reward(f"http://127.0.0.1:{port}"), ["Name a colour."], ["Blue."],
                                 trainer_state=SimpleNamespace(global_step=7))
            wait_for(lambda: '"/score",code="503"' in Client(f"http://127.0.0.1:{port}").metrics(), "a 503")
            server.batcher.release()
            got = [first.result()[2]["rewards"][0], second.result()[0]]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    logged = read_requests(requests_path(tmp_path / "policy.jsonl"))
    assert [e.step for e in logged] == [None, 7]
