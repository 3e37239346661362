# The SemIf child image: the AWS llama.cpp DLC plus the SemIf adapter as its entrypoint.
# SageMaker runs `docker run IMAGE serve`; `serve` is appended to the ENTRYPOINT below.
#   CPU: docker build .
#   GPU: docker build --build-arg BASE_IMAGE=763104351884.dkr.ecr.us-east-1.amazonaws.com/llama-cpp:server-sagemaker-cuda-v1 \
#                     --build-arg LLAMA_CMAKE_ARGS="-DGGML_CUDA=on -DGGML_NATIVE=OFF" .
ARG BASE_IMAGE=763104351884.dkr.ecr.us-east-1.amazonaws.com/llama-cpp:server-sagemaker-cpu-v1
FROM ${BASE_IMAGE}

# -march=native would bake the build host's CPU (AMX, AVX-512) into the library: keep it portable.
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SEMIF_SAGEMAKER_MODEL_DIR=/opt/ml/model \
    SEMIF_CACHE_DIR=/tmp/semif-cache

WORKDIR /opt/semif
COPY adapter/requirements.txt adapter/requirements.txt
RUN CMAKE_ARGS="${LLAMA_CMAKE_ARGS}" python3 -m pip install --no-cache-dir -r adapter/requirements.txt
COPY adapter/ adapter/
COPY data/policies/ data/policies/

EXPOSE 8080
ENTRYPOINT ["python3", "-m", "adapter"]
