"""The engine as a long-lived service: msgpack-RPC over stdio or TCP (docs/protocol.md). It is
started by `skyline serve` (cli/serve.py: its arguments → a ServiceConfig → a transport).

The flow, module by module:

    server          transports: stdio, TCP (a thread per client); bytes → frames → Dispatcher
    protocol        framing (bounded streaming msgpack), message validation, error objects
    dispatcher      per client: the handshake (initialize first, once; the TCP token), the methods
    params          checking parameters, with errors that name them
    analyses        per client: the running analysis, supersession, the latest complete document
    engine          shared by all clients: the worker pool, analysis ids, shutting down
    worker_pool     the service's side of the workers: their processes, the warm spare, one Job
                    per analysis (time limit, crashes)
    worker_messages what a worker may send, checked as untrusted input
    worker_main     the worker process's own program: imports torch, runs one analysis, exits
    failures        why a worker ended, in words (the user's frame from faulthandler's stacks:
                    entry/user_frames.py; ending what a worker started: skyline_engine/processes.py)
    paths           client_root: server paths → the client's
    tokens          the TCP token and its 0600 file

The service never imports torch: only workers do, so nothing the user's code does can take the
service down, and the service stays light on a GPU machine.
"""
