"""A monitored reward server: the reward model over HTTP, with the policy monitor watching the traffic.

```
rewardlens serve MODEL --port 8000 --log run/policy.jsonl      # the command line
```
```python
from rewardlens.serve import Client, remote_reward
Client("http://127.0.0.1:8000").get_reward(queries, prompts)      # OpenRLHF's protocol (POST /get_reward)
trl.GRPOTrainer(..., reward_funcs=remote_reward("http://127.0.0.1:8000"))   # TRL, monitored on the server
server = build_server(rl.load(path), log="run/policy.jsonl"); run_server(server, port=8000)   # in Python
```

One worker thread owns the model; requests queue (bounded: a full queue answers 503) and are scored in
batches up to a token budget, each caller getting exactly its own rewards (`RewardModel.read`, the reward
`model.score` gives). Every answered request is in the request log before its answer leaves; every monitored
sample reaches the `PolicyMonitor` `rewardlens.monitor.monitored_reward` uses, one record per training step.
See docs/serve.md. The worker's plumbing (the monitor's feed thread, the `/alarms` answer, the sequence limit,
pad stripping) is `rewardlens.serve.internal`.
"""

from .._deprecated import moved as _moved
from ._app import Options as Options
from ._app import create_app as create_app
from ._batcher import Batcher as Batcher
from ._client import Client as Client
from ._client import RemoteReward as RemoteReward
from ._client import ServerError as ServerError
from ._client import remote_reward as remote_reward
from ._log import Logged as Logged
from ._log import read_requests as read_requests
from ._log import requests_path as requests_path
from ._protocol import Limits as Limits
from ._protocol import RequestError as RequestError
from ._run import Server as Server
from ._run import build_server as build_server
from ._run import run_server as run_server

# The worker's plumbing moved to `rewardlens.serve.internal` (0.2, issue 43 item 3); the old names work for one
# release.
__getattr__ = _moved(__name__, dict.fromkeys(("Roller", "alarm_state", "sequence_limit", "strip_pad"),
                                            "rewardlens.serve.internal"))

__all__ = ["Batcher", "Client", "Limits", "Logged", "Options", "RemoteReward", "RequestError", "Server", "ServerError",
           "build_server", "create_app", "read_requests", "remote_reward", "requests_path", "run_server"]
