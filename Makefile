# gpuscope: `make demo` and `make test` are the two entry points (see README.md).
# Both install what they need, idempotently: a second run installs nothing new.

SHELL        := /bin/bash
PYTHON_SYS   ?= /usr/bin/python3
VENV         := .venv
PY           := $(VENV)/bin/python
BUILD        := build
FAKENVML_LIB := $(BUILD)/fakenvml/libnvidia-ml.so.1
FAKEAMDSMI_LIB := $(BUILD)/fakeamdsmi/lib/libamd_smi.so
CC           ?= cc
CFLAGS_FAKE  := -std=c11 -O2 -g -fPIC -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror
PYTEST_ARGS  ?=
# gpuscope/agent and gpuscope/exporters are links to agent/ and exporters/: lint each file once.
LINT_PATHS   := agent exporters gpuscope/__init__.py gpuscope/__main__.py tests scripts \
                scripts/gpu-check bench

.PHONY: all deps venv fakenvml fakeamdsmi kernel demo test lint typecheck unit integration \
        kernel-tests e2e deploy-tests image image-test oldest-nvml oldest-amdsmi bench bench-fleet golden-update clean

all: venv fakenvml fakeamdsmi

## System packages (Debian): compiler, venv, promtool. Skips apt entirely when all are present.
deps: $(BUILD)/.deps-stamp
$(BUILD)/.deps-stamp: scripts/install-deps.sh
	@bash scripts/install-deps.sh
	@mkdir -p $(BUILD) && touch $@

## Python virtual environment with pinned tools; rebuilt when the dependency files change.
venv: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml requirements-dev.txt $(BUILD)/.deps-stamp
	@test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@# bcc's bindings come from Debian's python3-bpfcc, not PyPI: link the package in.
	@ln -sfn /usr/lib/python3/dist-packages/bcc "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bcc"
	@touch $@

## The fake NVML library that tests and the demo put in front of the real pynvml bindings.
fakenvml: $(FAKENVML_LIB)
$(FAKENVML_LIB): tests/doubles/fakenvml/fakenvml.c $(BUILD)/.deps-stamp
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_FAKE) -shared -Wl,-soname,libnvidia-ml.so.1 -o $@ $< -lm -lpthread

## The fake AMD SMI library (ROCm's libamd_smi.so) that the real amdsmi bindings load from
## $ROCM_PATH/lib: it exports only the symbols amdsmi_wrapper.py binds (hidden by default).
fakeamdsmi: $(FAKEAMDSMI_LIB)
$(FAKEAMDSMI_LIB): tests/doubles/fakeamdsmi/fakeamdsmi.c $(BUILD)/.deps-stamp
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_FAKE) -fvisibility=hidden -shared -Wl,-soname,libamd_smi.so -o $@ $< -lpthread

## Kernel side of the eBPF tests: tracefs mounted, header trees under build/kernel-headers.
kernel: deps
	@bash scripts/setup-kernel.sh $(BUILD)/kernel-headers

demo: venv fakenvml fakeamdsmi kernel
	@$(PY) scripts/demo.py $(DEMO_ARGS)

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

typecheck: venv
	$(VENV)/bin/mypy

## The test tiers (tests/README.md). Without root, kernel-tests and e2e skip what needs it
## (GPUSCOPE_REQUIRE_ROOT=1 makes those skips failures, as in CI).
## unit: the quick tiers, no root: unit and deploy (about 20 s).
unit: venv fakenvml fakeamdsmi
	$(PY) -m pytest tests/unit tests/deploy $(PYTEST_ARGS)

## integration: the agent in process on the fake NVML (about 25 s; no root either).
integration: venv fakenvml fakeamdsmi
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

kernel-tests: venv fakenvml fakeamdsmi kernel
	$(PY) -m pytest tests/kernel $(PYTEST_ARGS)

e2e: venv fakenvml fakeamdsmi kernel
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

deploy-tests: venv fakenvml fakeamdsmi
	$(PY) -m pytest tests/deploy $(PYTEST_ARGS)

## The agent image (daemonset/Dockerfile), built with podman: no registry or container engine
## needed (scripts/build-image.sh). Tagged as the DaemonSet names it.
VERSION      := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' gpuscope/__init__.py)
IMAGE        ?= ghcr.io/gpuscope/gpuscope:$(VERSION)
image: deps venv
	@bash scripts/build-image.sh $(IMAGE) $(VERSION)

## The agent run from the image's file system, mounted as the DaemonSet mounts it, on the fake
## NVML and the kubelet double (tests/image; root: chroot, mounts).
image-test: venv fakenvml fakeamdsmi kernel
	GPUSCOPE_IMAGE=$(IMAGE) $(PY) -m pytest tests/image $(PYTEST_ARGS)

## Lint, types, the image and every tier (tests/image included), then the GPU collector again
## on the oldest supported bindings.
test: lint typecheck fakenvml fakeamdsmi kernel image
	GPUSCOPE_IMAGE=$(IMAGE) $(PY) -m pytest $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory oldest-nvml
	@$(MAKE) --no-print-directory oldest-amdsmi

## The oldest nvidia-ml-py gpuscope supports (README "Supported versions"), in a second venv
## that has only it of its own and borrows the test venv's other packages through a .pth
## line; the in-process GPU collector tests run there, less those pinned to the current
## bindings (golden files with NVML's NUMA node) and the fakes' own tests.
NVML_OLDEST  := 12.535.77
VENV_OLDEST  := $(BUILD)/venv-nvml-$(NVML_OLDEST)
oldest-nvml: venv fakenvml
	@test -x $(VENV_OLDEST)/bin/python || $(PYTHON_SYS) -m venv --without-pip $(VENV_OLDEST)
	@$(PY) -m pip --python $(VENV_OLDEST)/bin/python install -q --disable-pip-version-check \
		--no-deps nvidia-ml-py==$(NVML_OLDEST)
	@$(VENV_OLDEST)/bin/python -c 'import sys, sysconfig; open(sysconfig.get_paths()["purelib"] \
		+ "/test-venv.pth", "w").write(sys.argv[1] + "\n")' "$$($(PY) -c \
		'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	@$(VENV_OLDEST)/bin/python -c 'import pynvml, importlib.metadata as m; \
		print("oldest-nvml: nvidia-ml-py", m.version("nvidia-ml-py"), "from", pynvml.__file__)'
	$(VENV_OLDEST)/bin/python -m pytest -p no:cacheprovider tests/integration \
		--ignore=tests/integration/test_fakenvml.py \
		--ignore=tests/integration/test_fakeamdsmi.py -m "not pinned_bindings" $(PYTEST_ARGS)

## The oldest amdsmi bindings whose interface has every call the collector makes (6.4.0), in a
## second venv as for oldest-nvml, over the fake speaking the ROCm 6.4 library's ABI (profile
## mi300x-rocm64, which $GPUSCOPE_TEST_AMD_PROFILE puts in place of the default mi300x): the
## fake's own tests, the amd collector's and the AMD labels tests. Profiles of 7.0's ABI skip
## there; the golden files pin 7.0.2's values and stay out.
AMDSMI_OLDEST := 6.4.0
VENV_AMDSMI   := $(BUILD)/venv-amdsmi-$(AMDSMI_OLDEST)
oldest-amdsmi: venv fakeamdsmi
	@test -x $(VENV_AMDSMI)/bin/python || $(PYTHON_SYS) -m venv --without-pip $(VENV_AMDSMI)
	@$(PY) -m pip --python $(VENV_AMDSMI)/bin/python install -q --disable-pip-version-check \
		--no-deps amdsmi==$(AMDSMI_OLDEST)
	@$(VENV_AMDSMI)/bin/python -c 'import sys, sysconfig; open(sysconfig.get_paths()["purelib"] \
		+ "/test-venv.pth", "w").write(sys.argv[1] + "\n")' "$$($(PY) -c \
		'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	@$(VENV_AMDSMI)/bin/python -c 'import importlib.metadata as m; \
		print("oldest-amdsmi: amdsmi", m.version("amdsmi"), "over profile mi300x-rocm64")'
	GPUSCOPE_TEST_AMD_PROFILE=mi300x-rocm64 $(VENV_AMDSMI)/bin/python -m pytest -p no:cacheprovider \
		tests/integration/test_fakeamdsmi.py tests/integration/test_amd_collector.py \
		tests/integration/test_labels.py -k amd $(PYTEST_ARGS)

## Regenerate every golden file (expositions, labels), docs/metrics.md, the README's flag
## table and the generated rules/dashboards manifests after an intended change; review the diff.
golden-update: venv fakenvml
	GPUSCOPE_UPDATE_GOLDEN=1 $(PY) -m pytest tests/integration/test_golden.py \
		tests/integration/test_labels.py tests/unit/exporters tests/unit/net/test_rdma.py \
		tests/unit/agent/test_registry.py tests/deploy/test_deploy_assets.py

bench: venv fakenvml fakeamdsmi kernel
	$(PY) bench/bench_gpu.py
	$(PY) bench/bench_amd.py
	$(PY) -W ignore bench/bench_net.py
	$(PY) -W ignore bench/bench_attribution.py
	$(PY) bench/server_abuse.py --agent
	$(PY) bench/bench_vs_nvitop.py --quick

## A fleet on this machine (about 6 minutes; as root, for the simulated nodes' cgroups): Prometheus
## scraping 50 simulated nodes' agents with gpuscope's rules and the DCGM compatibility rules,
## remote-writing to VictoriaMetrics (Debian's, from `make deps`), every dashboard query asked of
## both (docs/performance.md, docs/scale.md). Not part of `make bench`.
## `make bench-fleet FLEET_ARGS="--nodes 10 --duration 60"`; `--help` for the rest.
bench-fleet: venv fakenvml
	$(PY) bench/bench_fleet.py $(FLEET_ARGS)

clean:
	rm -rf $(BUILD) $(VENV)
