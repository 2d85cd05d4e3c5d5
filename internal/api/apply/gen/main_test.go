package main

import (
	"bytes"
	"os"
	"testing"
)

// TestSchemaUpToDate fails when ../schema.yaml is not what client-go's
// schema gives for the served kinds (after a client-go update, or a new
// served kind): run `go generate ./internal/api/apply`.
func TestSchemaUpToDate(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../schema.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("internal/api/apply/schema.yaml is stale: run go generate ./internal/api/apply")
	}
}
