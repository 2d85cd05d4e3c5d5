# Each target is one line calling scripts/; see README.md.
.PHONY: build run test lint bench
build: ; scripts/build.sh
run: ; scripts/run.sh
test: ; scripts/test.sh
lint: ; scripts/lint.sh
bench: ; scripts/bench.sh
