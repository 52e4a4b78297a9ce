# Two commands are the contract (see README): `make demo` and `make test`, each on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# setuptools prints an "Editable installation" banner for every editable install of a package-dir
# mapping (ours: the stage folders install as lidarshard.*); it is information only.
PIP := PYTHONWARNINGS=ignore:::setuptools.command.editable_wheel $(PY) -m pip -q --disable-pip-version-check
# Packages install with uv (PyPI's `uv`, put into the venv by pip first): the same versions pip resolves
# (the two venvs' `pip freeze` diffed equal), in ~12 s instead of ~90 s here with a cold cache. torch alone
# goes through pip, which takes the CPU build this machine keeps on disk; uv would download a CUDA build.
# --compile-bytecode: uv, unlike pip, writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set
# (this machine) no process writes them either: every process would compile Beam, numpy and pyarrow from
# source again (`import apache_beam, pyarrow.parquet, numpy, hypothesis`: 4.2 s, against 1.7 s compiled).
UV := PYTHONWARNINGS=ignore:::setuptools.command.editable_wheel $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY)
DEMO ?= demo_out

# Editable installs are strict: build/__editable__.lidarshard-*/ mirrors the package with one link per
# file, which type checkers and editors follow (the default mode's import hook they cannot see through).
# Editing a module needs nothing, but a module file added, removed or renamed after the install is
# not linked: each install records the module files in $(VENV)/.modules, and demo, lint, test and
# bench first re-install the package alone (no dependencies, seconds) when that list has changed.
EDITABLE := -C editable_mode=strict -e
MODULES := find lidarshard pipelines transforms schemas loaders tools -name '*.py' | LC_ALL=C sort
RELINK := $(MODULES) | cmp -s - $(VENV)/.modules || { echo "module files changed: re-linking the editable install"; \
	$(UV) --no-deps $(EDITABLE) . && $(MODULES) > $(VENV)/.modules; }
# From $(VENV), not the repository root: there the bare lidarshard/ folder would shadow the installed
# package and `mypy -p lidarshard` would check lidarshard/__init__.py alone.
MYPY := cd $(VENV) && $(abspath $(VENV))/bin/mypy --config-file $(CURDIR)/pyproject.toml -p lidarshard

.PHONY: setup demo demo-lane test test-slow hostile test-trainer test-torch-min lint bench wheel clean

# What the demo needs: the Beam pipeline and the report plots (no torch, no cloud SDKs).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install uv
	$(UV) $(EDITABLE) ".[pipeline,report]"
	$(MODULES) > $(VENV)/.modules
	touch $@

# The rest for the tests: torch, the framework adapters, the Dataflow dry run, test tools, and spconv's
# CPU build (the sparse-conv backbone of examples/ and benchmarks/, never a trainer dependency; where no
# wheel fits the machine, the tests that need it skip).
$(VENV)/.test-installed: $(VENV)/.installed
	$(PIP) install torch==2.13.0  # pinned CPU build; a looser spec pulls a multi-GB CUDA build
	$(UV) $(EDITABLE) ".[test,dev,torch,report,gcp,dask]"
	$(UV) spconv==2.3.8 || echo "spconv not installable here: the spconv backbone tests skip"
	$(MODULES) > $(VENV)/.modules
	touch $@

setup: $(VENV)/.installed

# Fresh machine -> synthetic nuScenes-style dataroot -> balanced manifests -> validate -> report.
demo: setup
	@$(RELINK)
	rm -rf $(DEMO)
	$(VENV)/bin/lidarshard synth $(DEMO)/dataroot --scenes 6 --keyframes-per-scene 10 --seed 0
	$(VENV)/bin/lidarshard build $(DEMO)/dataroot $(DEMO)/manifest --nuscenes-version v1.0-synth --sweeps 9 \
		--world-size 4 --batch-size 2 --epochs 2 --seed 0
	$(VENV)/bin/lidarshard validate $(DEMO)/manifest
	$(VENV)/bin/lidarshard report $(DEMO)/manifest

# The demo's lane as CI runs it on a clean clone: `make demo` in a .venv holding only what it installs, then
# every product module imported there and the demo manifest read by ManifestReader (tests/lane_check.py).
demo-lane: demo
	$(PY) -m tests.lane_check $(DEMO)/manifest

# Optional oracles for the tests: open3d (cross-checks our PCD/PLY readers), nuscenes-devkit
# (loads the synthetic dataroot) in its own venv .venv-devkit because it pins numpy 1.26, made here
# rather than inside the first devkit test (minutes of pip, not a test), and headless Chromium
# from the Debian packages (opens the HTML report: tests/test_report_browser.py). All skip cleanly if
# they cannot be installed (the system packages only as root, with apt-get).
$(VENV)/.oracles: $(VENV)/.test-installed
	-if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		pkgs=""; ldconfig -p | grep -q libusb-1.0 || pkgs="libusb-1.0-0"; \
		command -v chromium >/dev/null || pkgs="$$pkgs chromium"; \
		if [ -n "$$pkgs" ]; then apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkgs >/dev/null || \
			echo "could not install$$pkgs: the tests that need them skip"; fi; fi
	-$(UV) open3d-cpu || $(UV) open3d || echo "open3d not installable: cross-check tests skip"
	-$(PY) -c "from tests.test_synth_devkit import _devkit_python; _devkit_python()" || \
		echo "could not make .venv-devkit: the devkit tests try again or skip"
	touch $@

lint: $(VENV)/.test-installed
	@$(RELINK)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MYPY)

# Two lanes, each in TEST_WORKERS processes (pytest-xdist; --dist loadfile keeps a test module on one
# worker, so its module-scoped fixtures, the Beam builds, are made once; TEST_WORKERS=0: one process).
# `make test`: lint, then every test marked neither slow nor hostile (minutes). `make test-slow`: the tests
# marked slow (trainer subprocesses under load, every Beam runner, the S3 server, signals to builds, the
# benchmarks' smoke runs, clean installs of the wheel) and the whole hostile-input suite (`make hostile`: every
# test marked hostile, of either lane, then tried / clean per family; tests/hostile_suite.py). The two lanes
# share no test, so .ci/run, which runs both, runs each test once.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

# mypy (single-threaded, ~30 s without its cache) runs beside the tests, on the core time they leave idle
# (their subprocesses' start-ups); its output is printed after them. Not niced: starved by the two test
# workers, it would run on alone after them.
test: $(VENV)/.test-installed $(VENV)/.oracles
	@$(RELINK)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@( $(MYPY) ) > $(VENV)/mypy.out 2>&1 & mypy=$$!; \
	echo '$(PYTEST) -m "not slow and not hostile"'; $(PYTEST) -m "not slow and not hostile"; status=$$?; \
	echo "mypy:"; wait $$mypy || status=1; cat $(VENV)/mypy.out; exit $$status

test-slow: $(VENV)/.test-installed $(VENV)/.oracles
	@$(RELINK)
	$(PYTEST) -m "slow or hostile"

hostile: $(VENV)/.test-installed $(VENV)/.oracles
	@$(RELINK)
	$(PYTEST) -m hostile

# Every benchmark's smoke run first (tests/test_benchmarks.py, in the slow lane: about 3 minutes), then
# the figures of docs/BENCHMARKS.md at their sizes (about 25 minutes on 2 idle cores, 10 of them the 10M build). A benchmark whose
# own check fails (same rows, same bytes, samples kept) exits non-zero and stops make.
bench: $(VENV)/.test-installed
	@$(RELINK)
	$(PY) -m pytest -q -p no:cacheprovider tests/test_benchmarks.py
	$(PY) benchmarks/balance_bench.py --quick
	$(PY) benchmarks/scan_bench.py
	$(PY) benchmarks/plan_bench.py --sizes 1000000 --sweeps 9
	$(PY) benchmarks/merge_bench.py --sizes 1000000
	$(PY) benchmarks/loader_bench.py
	$(PY) benchmarks/layout_bench.py
	$(PY) benchmarks/groups_bench.py --n 4194304 --groups 1,4
	$(PY) benchmarks/plan_bench.py --sizes 1000000,4000000 --sweeps 9 --baseline 0 --plan-groups 1,auto
	$(PY) benchmarks/plan_bench.py --sizes 1000000,4000000,10000000 --sweeps 9 --baseline 0 --plan-groups auto
	$(PY) benchmarks/plan_bench.py --sizes 200000 --baseline 0 --runners direct,dask --plan-groups 3
	$(PY) benchmarks/validate_bench.py --sizes 1000000,4000000 --sweeps 9

# The trainer's install as a trainer installs it: `pip install .` (no extras: no Beam, no pandas) in a fresh venv
# outside the repository, at the lowest versions pyproject.toml allows (numpy 1.24.0, pyarrow 14.0.0,
# python-neo-lzf 0.3.0 and duckdb 1.5.0, which all install on Python 3.11 here), with torch 2.13.0 (the CPU build on disk: the
# loaders' torch adapters; `make test-torch-min` has the lowest torch). Then, on the demo's manifest:
# `lidarshard validate`, every product module imported and ManifestReader over every rank (tests/lane_check.py),
# and the Beam-free tests, run from a copy (the repository's bare lidarshard/ folder would shadow the install);
# test_validate_samples holds validate's database to that DuckDB (its pages, its writes beside its reads).
TRAINER_PINS := "numpy==1.24.0" "pyarrow==14.0.0" "python-neo-lzf==0.3.0" "duckdb==1.5.0"
TRAINER_VENV ?= $(HOME)/.cache/lidarshard/venv-trainer
TRAINER_TESTS := test_timing test_hostile_recorder test_loaders_torch test_loaders_evaluation \
	test_epoch_plan test_points_fast test_nan_points test_devkit_points test_hostile_cache test_exit \
	test_validate_samples
TEST_TOOLS := "pytest>=7" "pytest-timeout>=2.2" "hypothesis>=6.90"
# $(1): the venv, $(2): what to install beside the package (its pins, torch, the test tools)
define trainer_lane
	test -f $(DEMO)/manifest/_SUCCESS || $(MAKE) demo
	rm -rf $(1) && $(PYTHON) -m venv $(1)
	rm -rf build/lib build/bdist.*  # else setuptools packs what an earlier build left there (removed modules too)
	$(1)/bin/python -m pip -q --disable-pip-version-check install . $(2)
	! $(1)/bin/python -c "import apache_beam" 2>/dev/null  # the trainer's install has no Beam
	! $(1)/bin/python -c "import pandas" 2>/dev/null  # nor pandas
	rm -rf $(1)/run && mkdir -p $(1)/run
	cp -r tests examples benchmarks pyproject.toml $(1)/run/
	$(1)/bin/lidarshard validate $(abspath $(DEMO))/manifest
	cd $(1)/run && ../bin/python -c "import numpy, pyarrow, torch; print('numpy', numpy.__version__, \
		'pyarrow', pyarrow.__version__, 'torch', torch.__version__)" && \
		../bin/python -m tests.lane_check $(abspath $(DEMO))/manifest && \
		../bin/python -m pytest -q -p no:cacheprovider $(TRAINER_TESTS:%=tests/%.py)
endef

test-trainer:
	$(call trainer_lane,$(TRAINER_VENV),$(TRAINER_PINS) torch==2.13.0 $(TEST_TOOLS))

# The same lane at the lowest torch the loaders declare (pyproject: torch>=2.1). PyPI has only the CUDA build of
# torch 2.1 (~2.5 GB with its nvidia-* wheels), so this is not part of `make test` or .ci/run; torch 2.1 was
# built against numpy 1.x: numpy<2, pyarrow<22.
TORCH_MIN ?= 2.1.2
TORCH_MIN_VENV ?= $(HOME)/.cache/lidarshard/venv-torch-$(TORCH_MIN)
test-torch-min:
	$(call trainer_lane,$(TORCH_MIN_VENV),"torch==$(TORCH_MIN)" "numpy<2" "pyarrow>=14,<22" $(TEST_TOOLS))

# The wheel to install into your own training environment: pip install dist/lidarshard-*.whl
wheel: setup
	rm -rf dist
	$(PY) -m pip wheel -q --no-deps -w dist .

clean:
	rm -rf $(VENV) .venv-devkit $(DEMO) dist build .pytest_cache .hypothesis
