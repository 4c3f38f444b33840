"""The engine's room: the model, its micro-batching scheduler, CUDA graphs, hot reload, and the end of
the front-ends' links (link_server.py). One engine process per device."""
