# The tandem image: the `tandem` command with the server extra (workers, orchestrator, Ray
# Serve), and the demo model pair at /opt/tandem/models. The Helm chart (helm/tandem) runs
# its containers with exactly the commands of the local cluster: `tandem worker draft ...`,
# `tandem worker target ...`, `tandem orchestrator ...` (and Ray, under KubeRay).
#
#   docker build -t tandem:0.1.0 .                               # CPU
#   docker build -t tandem:0.1.0-cu128 --build-arg TORCH_VARIANT=cu128 .   # CUDA 12.8
#
# CUDA: PyTorch's CUDA wheels bring the CUDA runtime libraries with them; the node needs only
# the NVIDIA driver and container toolkit (the GPU Operator, or your cloud's GPU node image).
# Not built or run here (no Docker on the machines this was written on): it is kept simple.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tandem tandem
COPY services services
COPY orchestrator orchestrator
RUN pip wheel --no-deps --no-cache-dir . -w /wheels

FROM python:${PYTHON_VERSION}-slim
# cpu, or a CUDA build of PyTorch: cu126, cu128, ... (https://download.pytorch.org/whl/)
ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1
# wget: KubeRay's exec probes of the Ray containers call it.
RUN apt-get update && apt-get install -y --no-install-recommends wget && rm -rf /var/lib/apt/lists/*
RUN pip install "torch==${TORCH_VERSION}" --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}"
COPY --from=wheel /wheels /wheels
RUN pip install "$(ls /wheels/tandem-*.whl)[server]" && rm -rf /wheels
# After the installs, which byte-compile every package: the root filesystem is read-only at run time.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
# The demo pair (models/README.md): what the chart's defaults serve.
COPY models/draft /opt/tandem/models/draft
COPY models/target /opt/tandem/models/target
COPY models/head /opt/tandem/models/head
# The chart runs every container as this user, with a read-only root filesystem and /tmp
# an emptyDir.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp tandem
USER 10001
ENTRYPOINT ["tandem"]
CMD ["--help"]
