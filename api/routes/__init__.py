"""One router per resource; each is thin: parse, authorize, call a service, answer."""

from api.routes import catalogue, fleets, health, jobs, links, plans, profiles, schemas

ROUTERS = [
    catalogue.gpu_types,
    catalogue.models,
    catalogue.clusters,
    profiles.router,
    links.router,
    fleets.pareto_router,  # before plans.router: /v1/plans/pareto is not a plan id
    plans.router,
    plans.evaluate_router,
    jobs.router,
    fleets.whatif_router,
    schemas.router,
]

__all__ = ["ROUTERS", "health"]
