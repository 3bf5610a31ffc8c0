# Sourced by benchmarks/kit_gpu.sh and benchmarks/paper_tables_gpu.sh on a GPU machine without
# network, from the checkout's root: what both need beyond the machine's GPU image.

# install_wheels DIR: locvit's dependencies from the wheels that travelled with the checkout
# (python benchmarks/gpu_wheels.py), into /tmp/locvit-site, on PYTHONPATH after the checkout.
install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/locvit-site \
    "$1"/*.whl || return 2
  export PYTHONPATH=$PWD:/tmp/locvit-site PYTHONUNBUFFERED=1
}

# use_cifar10: exports CIFAR10_ROOT, CIFAR-10 as JPEG folders (ROOT/{train,test}/<class>/*.jpg):
# as set, else the carried tarball ($CIFAR10_TARBALL, default data/cifar10-jpeg.tar.gz,
# git-ignored) unpacked to /tmp/cifar once per machine.
use_cifar10() {
  if [ -z "${CIFAR10_ROOT:-}" ]; then
    if [ ! -d /tmp/cifar/train ]; then  # unpacked whole, then moved: never half a folder
      rm -rf /tmp/cifar.part && mkdir -p /tmp/cifar.part \
        && tar -xzf "${CIFAR10_TARBALL:-data/cifar10-jpeg.tar.gz}" -C /tmp/cifar.part \
        && rm -rf /tmp/cifar && mv /tmp/cifar.part /tmp/cifar || return 2
    fi
    export CIFAR10_ROOT=/tmp/cifar
  fi
}
