"""One router per resource; each is thin: parse, authorize, call a service, answer."""

from api.routes import catalogue, health, jobs, links, plans, profiles, schemas

ROUTERS = [
    catalogue.gpu_types,
    catalogue.models,
    catalogue.clusters,
    profiles.router,
    links.router,
    plans.router,
    plans.evaluate_router,
    jobs.router,
    schemas.router,
]

__all__ = ["ROUTERS", "health"]
