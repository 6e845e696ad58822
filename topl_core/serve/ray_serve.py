"""The same service on Ray Serve, for more than one machine: each replica opens its own steering session (a merged
model with its vectors: `open_session`, which Ray ships to the replica) and engine behind the same FastAPI app
(app.py), and Ray Serve's proxy spreads the requests over them. Ray Serve is optional (`pip install "ray[serve]"`);
docs/serve.md, "Ray Serve", says how to deploy on a cluster.

    adapter = "examples/adapters/topl-smollm2"
    opens = functools.partial(SteeringSession.from_run, adapter, page_vectors(adapter))   # analysis/steering/extract
    application = ray_application(adapter, opens, replicas=2)
    serve.run(application, route_prefix="/")        # the OpenAI API at Ray Serve's HTTP address, /v1/...
"""

from __future__ import annotations

from typing import Callable

from ..foundations.errors import ConfigError
from ..runtime.session import SteeringSession
from ..training.adapters import open_adapter
from .app import LOOPBACK_HOSTS, create_app, serve_engine
from .engine import ServeEngine


def ray_application(
    adapter: str,
    open_session: Callable[[], SteeringSession],
    precision: str = "auto",
    replicas: int = 1,
    slots: int = 16,
    waiting: int = 32,
    api_key: str | None = None,
    cpus_per_replica: float = 1.0,
):
    """A Ray Serve application of the service on `adapter`: `replicas` replicas, each with its own engine on the
    session `open_session()` opens there."""
    try:
        from ray import serve
    except ImportError as e:
        raise ConfigError(f'Ray Serve is not installed ({e}); install it with: pip install "ray[serve]"') from None
    name = open_adapter(adapter).name
    # keyless, the proxy answers loopback names only (DNS rebinding); with a key, any name the cluster is reached by
    app = create_app(None, name, api_key, allowed_hosts=None if api_key else LOOPBACK_HOSTS)
    key = app.state.engine_key

    @serve.deployment(num_replicas=replicas, ray_actor_options={"num_cpus": cpus_per_replica})
    @serve.ingress(app)
    class Workbench:
        def __init__(self) -> None:
            serve_engine(key, ServeEngine(open_session(), precision, slots, waiting))

    return Workbench.bind()
