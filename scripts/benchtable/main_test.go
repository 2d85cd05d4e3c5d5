package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	in := `goos: linux
BenchmarkWrite/writers=1/store=orch-2   1  5 ns/op  300.0 p50-µs  3000 writes/s
BenchmarkWrite/writers=1/store=etcd-2   1  5 ns/op  200.0 p50-µs  1000 writes/s
BenchmarkWrite/writers=1/store=orch-2   1  5 ns/op  100.0 p50-µs  2000 writes/s
BenchmarkWrite/writers=1/store=orch-2   1  5 ns/op  400.0 p50-µs  9000 writes/s
BenchmarkWatch-2   1  5 ns/op  12.5 p99-ms
BenchmarkWatch-2   1  5 ns/op  10.5 p99-ms
BenchmarkWatch-2   1  5 ns/op  30.5 p99-ms
BenchmarkCreate/store=embedded3-2   1  5 ns/op  700 creates/s
`
	var out bytes.Buffer
	if err := table(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| Write/writers=1 | p50-µs | 300 | 200 | 1.50x worse |",
		"| Write/writers=1 | writes/s | 3000 | 1000 | 3.00x better |",
		"| Watch | p99-ms | 12.5 |",
		"| Create/store=embedded3 | creates/s | 700 |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "ns/op") {
		t.Error("ns/op of a one-shot workload should not be tabled")
	}
}
