"""The same service on Ray Serve, for more than one machine: each replica loads its own merged model and engine
(ServeEngine.for_adapter) behind the same FastAPI app (app.py), and Ray Serve's proxy spreads the requests over them.
Ray Serve is optional (`pip install "ray[serve]"`); docs/serve.md, "Ray Serve", says how to deploy on a cluster.

    application = ray_application("examples/adapters/topl-smollm2", replicas=2)
    serve.run(application, route_prefix="/")        # the OpenAI API at Ray Serve's HTTP address, /v1/...
"""

from __future__ import annotations

from ..foundations.errors import ConfigError
from ..training.adapters import open_adapter
from .app import LOOPBACK_HOSTS, create_app, serve_engine
from .engine import ServeEngine


def ray_application(
    adapter: str,
    precision: str = "auto",
    replicas: int = 1,
    slots: int = 16,
    waiting: int = 32,
    api_key: str | None = None,
    cpus_per_replica: float = 1.0,
):
    """A Ray Serve application of the service on `adapter`: `replicas` replicas, each with its own engine."""
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
            serve_engine(key, ServeEngine.for_adapter(adapter, precision, slots, waiting))

    return Workbench.bind()
