"""Attacks on the daemon's front door (issue 19), long versions, against a
live daemon: `python -m bench.attack` (see `__main__` for the command line).

- `payloads`: what is sent (gzip bomb, streamed JSON bodies, header flood);
- `net`: raw-socket exchanges and the steady normal client (httpx);
- `proc`: the front-end's RSS from /proc, this client's file limit;
- `daemon`: the attacks' model repository and the daemon's launch;
- `runner`: one attack around a fresh daemon, with its budget;
- `bodies`, `connections`, `lifecycle`: the attacks; `catalog`: by name;
- `report`: results, targets and the tables.
"""
