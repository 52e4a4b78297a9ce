# SDK worker container: what Dataflow custom containers and the Spark/Flink portable runners start
# on every worker. Beam's own Python SDK image of OUR Beam and Python versions (tests/test_dockerfile.py
# checks them against pyproject.toml and the venv), plus the lidarshard wheel with [pipeline].
#
#   pip wheel --no-deps -w dist .
#   docker build -t IMAGE .
#
# Commands for each runner: docs/RUNNERS.md ("SDK worker container").
FROM apache/beam_python3.11_sdk:2.77.0

COPY dist/lidarshard-*.whl /tmp/wheels/
# The constraint keeps the image's Beam: a newer one from the index would not match the launcher's.
RUN pip install --no-cache-dir "apache-beam==2.77.0" \
        "$(ls /tmp/wheels/lidarshard-*.whl)[pipeline]" \
    && rm -rf /tmp/wheels \
    && python -c "import lidarshard.pipelines.build, apache_beam; assert apache_beam.__version__ == '2.77.0'"
# ENTRYPOINT stays the base image's /opt/apache/beam/boot (the SDK harness).
