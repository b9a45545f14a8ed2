# `make demo` and `make test` do all set-up on a fresh machine: they create .venv and install
# samsa with every extra and test dependency before running. `make test` also installs Java 17,
# Maven and kcat when missing and resolves the pinned Apache Kafka (kafka/pom.xml) from Maven
# Central into a cache outside the repository; `make demo` needs neither Maven nor Kafka.
PY ?= $(shell for p in python3.11 python3; do \
        command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
        && { command -v $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' kafka/pom.xml)
SAMSA_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/samsa
KAFKA_CP := $(SAMSA_CACHE)/kafka-$(KAFKA_VERSION)/classpath.txt
SPARK_KAFKA_VERSION := $(shell sed -n \
  's:.*<spark.kafka.version>\(.*\)</spark.kafka.version>.*:\1:p' kafka/spark-connector/pom.xml)
SPARK_KAFKA_CP := $(SAMSA_CACHE)/spark-kafka-$(SPARK_KAFKA_VERSION)/classpath.txt
export SAMSA_CACHE

.PHONY: demo test bench bench-spark-connector cluster-check lint clean kafka spark-connector java

# setup.py builds protocol/_records.c in place: a changed walker is rebuilt, never left stale.
$(STAMP): pyproject.toml setup.py src/samsa/protocol/_records.c
	@test -n "$(PY)" || { echo "Python 3.11 is needed (python3.11 or python3 on the PATH)"; exit 1; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[fast,test,bench,spark,verify]'
	@touch $(STAMP)

# Java 17 (Spark, Kafka), Maven (resolves Kafka) and kcat (interop tests), from Debian's packages.
# The JDK, not the JRE: tests/oracle/java/*.java run through the single-file source launcher,
# which needs the compiler.
java:
	@command -v javac >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1 \
	  && command -v kcat >/dev/null 2>&1 || { \
	  echo "installing Java 17, Maven and kcat"; \
	  (apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless maven kcat) >/dev/null; }

$(KAFKA_CP): kafka/pom.xml
	@$(MAKE) --no-print-directory java
	@mkdir -p $(dir $(KAFKA_CP))
	@echo "resolving Apache Kafka $(KAFKA_VERSION) into $(dir $(KAFKA_CP))"
	mvn -B -q -f kafka/pom.xml dependency:build-classpath -Dmdep.outputFile=$(KAFKA_CP).tmp
	@mv $(KAFKA_CP).tmp $(KAFKA_CP)

kafka: $(KAFKA_CP)

# Spark's own Kafka connector (kafka/spark-connector/pom.xml), the peer of samsa's Spark source
# and sink in benchmarks/spark_connector.py; only the jars pyspark lacks.
$(SPARK_KAFKA_CP): kafka/spark-connector/pom.xml
	@$(MAKE) --no-print-directory java
	@mkdir -p $(dir $(SPARK_KAFKA_CP))
	@echo "resolving Spark's Kafka connector $(SPARK_KAFKA_VERSION) into $(dir $(SPARK_KAFKA_CP))"
	mvn -B -q -f kafka/spark-connector/pom.xml dependency:build-classpath \
	  -Dmdep.outputFile=$(SPARK_KAFKA_CP).tmp
	@mv $(SPARK_KAFKA_CP).tmp $(SPARK_KAFKA_CP)

spark-connector: $(SPARK_KAFKA_CP)

demo: $(STAMP)
	@command -v java >/dev/null 2>&1 || { echo "installing Java (for Spark)"; \
	  (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless) >/dev/null; }
	$(BIN)/samsa demo

test: $(STAMP) java $(KAFKA_CP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

# samsa beside Apache Kafka (first peer) and Tansu, then the produce/fetch table against Tansu
bench: $(STAMP) java $(KAFKA_CP)
	$(BIN)/python benchmarks/peers.py
	$(BIN)/python benchmarks/produce.py

# samsa's Spark source and exactly-once sink against Spark's Kafka connector, on samsa and
# on Kafka (~3 min)
bench-spark-connector: $(STAMP) $(KAFKA_CP) $(SPARK_KAFKA_CP)
	$(BIN)/python benchmarks/spark_connector.py

# samsa verify on a 3-node Kafka cluster, once per fault and with all faults (~5 min)
cluster-check: $(STAMP) $(KAFKA_CP)
	$(BIN)/python benchmarks/cluster_check.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) samsa-data
