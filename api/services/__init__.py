"""Domain logic of the service, between the routes (HTTP) and the store (SQL): what an
upload means, how a scenario is assembled from stored pieces, how a plan is solved and
recorded. Nothing here knows about requests or responses."""
