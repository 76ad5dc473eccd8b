# hetplan service image: non-root, SQLite in /data by default, PostgreSQL through
# HETPLAN_DATABASE_URL. Listening on 0.0.0.0 needs HETPLAN_TOKENS (or HETPLAN_OPEN=true).
#
#   docker build -t hetplan .
#   docker run -p 127.0.0.1:8000:8000 -e HETPLAN_TOKENS='{"change-me": ["admin"]}' hetplan

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY planner ./planner
COPY profiles ./profiles
COPY launcher ./launcher
COPY api ./api
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HETPLAN_DATABASE_URL=sqlite:////data/hetplan.db
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10001 --home-dir /data --create-home hetplan
USER 10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status != 200)"]
CMD ["hetplan", "serve", "--host", "0.0.0.0", "--port", "8000"]
