# The README's two commands: `make demo` (a local cluster answering a generation) and
# `make test`. Both create and use the virtual environment at .venv/.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test protos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev]'
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
