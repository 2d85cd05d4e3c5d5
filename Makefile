# Each target is one line calling scripts/; see README.md.
.PHONY: build run test e2e lint bench release conformance
build: ; scripts/build.sh
run: ; scripts/run.sh
test: ; scripts/test.sh
e2e: ; scripts/e2e.sh
lint: ; scripts/lint.sh
bench: ; scripts/bench.sh
release: ; scripts/release.sh
conformance: ; scripts/conformance/run.sh
