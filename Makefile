# The README's two commands: `make demo` (a local cluster answering a generation) and
# `make test`; `make test-fast` (without the slow tiers) and `make docs` (the documentation
# site, docs/). All create and use the virtual environment at .venv/.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast docs protos clean

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

# The suite without its slow tiers (pyproject.toml's markers): no whole cluster, no killed
# processes, no multi-host test bed.
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -p no:cacheprovider -m "not cluster and not chaos and not network"

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

protos: $(STAMP)
	bash scripts/gen_protos.sh

clean:
	rm -rf $(VENV) .tandem site
