# The README's two commands: `make demo` (a local cluster answering a generation) and
# `make test`. Both create and use the virtual environment at .venv/.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test protos clean

# --no-compile: Python byte-compiles the modules it imports when it first imports them; compiling
# all of torch, Ray and transformers at install time costs CI minutes for files never loaded.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q --no-compile torch==2.13.0
	$(VENV)/bin/pip install -q --no-compile -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh

# pytest, not `python -m pytest`: the checkout's root stays off sys.path, so tests import
# tandem as it is installed.
test: $(STAMP)
	$(VENV)/bin/pytest -q -p no:cacheprovider

protos: $(STAMP)
	bash scripts/gen_protos.sh

clean:
	rm -rf $(VENV) .tandem
