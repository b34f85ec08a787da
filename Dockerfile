# deadline-serve's container image: the server on the bundled models.
#
#   podman build -t deadline-serve .                              # CPU
#   podman build -t deadline-serve:cuda --build-arg EXTRAS=gpu .  # CUDA (ONNX Runtime's GPU build)
#   podman run --rm -p 8000:8000 -p 8001:8001 deadline-serve
#
# BASE is any Debian bookworm image. With no image registry at hand, make one
# from Debian's packages (docs/container.md):
#   debootstrap --variant=minbase bookworm rootfs http://deb.debian.org/debian
#   tar -C rootfs -c . | podman import - localhost/debian:bookworm
ARG BASE=localhost/debian:bookworm
FROM ${BASE}

# "gpu": ONNX Runtime's CUDA build instead of its CPU one (the `gpu` extra).
ARG EXTRAS=""
# Behind a TLS-inspecting proxy: its CA bundle, mounted into the build
# (podman build -v /etc/ssl/certs/ca-certificates.crt:/run/ca.crt:ro
#  --build-arg CA_BUNDLE=/run/ca.crt), for pip.
ARG CA_BUNDLE=""

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/deadline-serve
ENV PATH=/opt/deadline-serve/bin:$PATH

# The package only (the wheel installs `app`; bench/ and tests/ stay out).
COPY pyproject.toml README.md /src/
COPY app /src/app
RUN if [ -n "$CA_BUNDLE" ]; then export PIP_CERT="$CA_BUNDLE"; fi \
 && pip install --no-cache-dir "/src${EXTRAS:+[$EXTRAS]}" \
 && if [ "$EXTRAS" = "gpu" ]; then \
      pip uninstall -y onnxruntime \
      && pip install --no-cache-dir --force-reinstall --no-deps "onnxruntime-gpu>=1.17"; \
    fi \
 && rm -rf /src

# The bundled models' files are built now, not at each start, so the
# installed package can stay read-only.
RUN python -c "from app.repository import BUNDLED_REPOSITORY as r; \
from app.repository.bundled import ensure_bundled_models as b; b(r)"

RUN useradd --system --create-home --home-dir /var/lib/deadline-serve deadline-serve
USER deadline-serve
WORKDIR /var/lib/deadline-serve

# Reachable from outside the container; model load/unload stay off unless
# ADMIN_TOKEN is given (docs/reliability.md, Exposure).
ENV HOST=0.0.0.0 \
    PORT=8000 \
    GRPC_PORT=8001 \
    PROFILE_CACHE_DIR=/var/lib/deadline-serve/profiles
EXPOSE 8000 8001
ENTRYPOINT ["deadline-serve", "serve"]
