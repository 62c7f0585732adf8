# darkformer on Debian 12, built and tested the way tools/setup.sh and tools/run_tests.sh do it.
# The machines we develop on have the CUDA 13.0 toolkit (with cuDNN and NCCL) in /usr/local/cuda;
# here it comes from NVIDIA's CUDA 13.0 cuDNN devel image, copied into a Debian 12 base.
#   docker build -t darkformer .
#   docker run --rm darkformer tools/run_demo.sh            # add --gpus all to train on a GPU
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-cudnn-devel-ubuntu22.04
FROM ${CUDA_IMAGE} AS cuda

FROM debian:12
COPY --from=cuda /usr/local/cuda-13.0 /usr/local/cuda-13.0
# cuDNN and NCCL live in the system library dir of the CUDA image; LibTorch's CUDA library needs them.
COPY --from=cuda /usr/lib/x86_64-linux-gnu/libcudnn* /usr/lib/x86_64-linux-gnu/libnccl* /usr/local/cuda-13.0/lib64/
RUN ln -s /usr/local/cuda-13.0 /usr/local/cuda \
 && echo /usr/local/cuda/lib64 > /etc/ld.so.conf.d/cuda.conf && ldconfig
ENV PATH=/usr/local/cuda/bin:${PATH}

RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates python3 python3-venv python3-pip sudo && rm -rf /var/lib/apt/lists/*

WORKDIR /darkformer
COPY . .
# Same steps as the README's commands: setup (apt packages, venv with torch==2.11.0, demo corpus),
# build, tests.
RUN tools/setup.sh && tools/build.sh && tools/run_tests.sh
CMD ["tools/run_demo.sh"]
