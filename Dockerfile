# GPU image: torch + TensorRT + Torch-TensorRT + trt-inline, running the GPU suite and the example.
#   docker build --build-arg TORCH_VERSION=2.13.0 --build-arg TORCH_TENSORRT_VERSION=2.13.0 -t trt-inline-gpu:2.13.0 .
#   docker run --rm --gpus all -v "$PWD/reports:/home/runner/reports" trt-inline-gpu:2.13.0
# Torch-TensorRT X.Y requires torch X.Y; 2.13 and 2.14 ship TensorRT for CUDA 13.
ARG TORCH_VERSION=2.13.0
ARG CUDA_FLAVOR=cuda13.0-cudnn9-runtime
FROM pytorch/pytorch:${TORCH_VERSION}-${CUDA_FLAVOR}

ARG TORCH_VERSION=2.13.0
ARG TORCH_TENSORRT_VERSION=2.13.0

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    TRT_INLINE_REPORTS=/home/runner/reports

# torch is pinned again so that resolving torch-tensorrt can never swap the image's build.
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" "torch-tensorrt==${TORCH_TENSORRT_VERSION}" \
    && useradd --create-home --uid 1000 runner
WORKDIR /home/runner/trt-inline
COPY --chown=1000:1000 . .
# The installed torch satisfies trt-inline's requirement, so this adds only its small dependencies.
RUN pip install --no-cache-dir -e ".[test]"

USER 1000
CMD ["bash", ".ci/gpu"]
