"""The service on Ray Serve, run once locally with one replica: a local Ray cluster, the application of
topl_core/serve/ray_serve.py on an adapter (default: a tiny TOPL run trained here in seconds), and the official openai
client against Ray Serve's HTTP proxy — the steered completion must be the one the plain service (uvicorn) gives.

    .venv/bin/python scripts/ray_serve_check.py                 # the tiny run
    .venv/bin/python scripts/ray_serve_check.py --run examples/adapters/topl-smollm2
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import threading
import time
from pathlib import Path

import openai
import uvicorn

from topl_core.analysis.steering.extract import page_vectors
from topl_core.bench.serve import messages
from topl_core.data.perturb import build_perturbation_records
from topl_core.runtime.session import SteeringSession
from topl_core.serve.app import create_app
from topl_core.serve.engine import ServeEngine
from topl_core.serve.ray_serve import ray_application
from topl_core.training.config import tiny_topl_config
from topl_core.training.trainer import train

DOCUMENT = "The council of Leeds approved the new budget on Monday after a long debate. Police arrested two men."


PAIRS = [
    (
        f"d{i}",
        f"The council of {town} approved the new budget on Monday. Police arrested {n} men in {town}.",
        f"The {town} council approved the budget on Monday. Police arrested {n} men.",
    )
    for i, (town, n) in enumerate([("Leeds", 2), ("Oxford", 3), ("Bristol", 4), ("Cardiff", 5), ("York", 6)] * 4)
]


def tiny_run(folder: Path) -> str:
    """A tiny TOPL run, trained here in seconds."""
    records = build_perturbation_records(PAIRS, seed=0)
    return str(train(tiny_topl_config(), folder / "topl-tiny", records=records).path)


def complete(url: str, model: str) -> list[int]:
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    reply = client.chat.completions.create(
        model=model,
        messages=messages(DOCUMENT),
        max_tokens=12,
        temperature=0,
        extra_body={"steering": {"mode": "vector", "lambda": 2}},
    )
    return [t.token_id for t in reply.choices[0].logprobs.content]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="the adapter to serve (default: a tiny run trained here)")
    p.add_argument("--precision", default="fp32")
    args = p.parse_args()
    import ray
    from ray import serve

    with tempfile.TemporaryDirectory() as tmp:
        adapter = args.run or tiny_run(Path(tmp))
        opens = functools.partial(SteeringSession.from_run, adapter, page_vectors(adapter, args.precision))
        engine = ServeEngine(opens(), args.precision, slots=4)
        plain = uvicorn.Server(uvicorn.Config(create_app(engine, Path(adapter).name), port=8731, log_level="warning"))
        threading.Thread(target=plain.run, daemon=True).start()
        while not plain.started:
            time.sleep(0.05)
        expected = complete("http://127.0.0.1:8731/v1", Path(adapter).name)
        plain.should_exit = True
        engine.close()

        ray.init(num_cpus=2, include_dashboard=False)
        t0 = time.perf_counter()
        serve.run(ray_application(adapter, opens, args.precision, replicas=1, slots=4), route_prefix="/")
        print(f"Ray Serve: the application deployed with one replica in {time.perf_counter() - t0:.1f} s")
        got = complete("http://127.0.0.1:8000/v1", Path(adapter).name)
        serve.shutdown()
        ray.shutdown()
    print(f"plain service: {expected}\nRay Serve:     {got}")
    if got != expected:
        raise SystemExit("error: Ray Serve's completion differs from the plain service's")
    print("the same tokens through Ray Serve as through the plain service")


if __name__ == "__main__":
    main()
