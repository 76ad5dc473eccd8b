"""hetplan's edges: the HTTP service (`api.app.create_app`), its storage, the CLI and the
httpx client (`api.client`). The planner core (`planner`) knows nothing of them."""
