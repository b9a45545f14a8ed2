# `make demo` and `make test` do all set-up on a fresh machine: they create .venv and install
# samsa with every extra and test dependency before running.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	@command -v java >/dev/null 2>&1 && command -v kcat >/dev/null 2>&1 || { \
	  echo "installing Java (for Spark) and kcat (interop tests)"; \
	  (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless kcat) >/dev/null; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[fast,test,bench,spark,verify]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/samsa demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

bench: $(STAMP)
	$(BIN)/python benchmarks/produce.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) samsa-data
