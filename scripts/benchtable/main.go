// Command benchtable reads `go test -bench` output on stdin and prints one
// row per benchmark and metric with orch's and etcd's numbers side by side
// and their ratio. Benchmarks name the store they ran as a `store=orch` or
// `store=etcd` path element; those that name neither (the API server's,
// or another store such as three servers' own etcd) get a table of their
// own values. With -count above 1 the median of each is used.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

var gomaxprocs = regexp.MustCompile(`-\d+$`)

type row struct{ bench, metric string }

func main() {
	if err := table(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func table(in io.Reader, out io.Writer) error {
	samples := map[row]map[string][]float64{}
	var order []row
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name, store := splitStore(strings.TrimPrefix(gomaxprocs.ReplaceAllString(f[0], ""), "Benchmark"))
		for i := 2; i+1 < len(f); i += 2 {
			if f[i+1] == "ns/op" {
				continue
			}
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return fmt.Errorf("%s: %w", f[0], err)
			}
			r := row{name, f[i+1]}
			if samples[r] == nil {
				samples[r] = map[string][]float64{}
				order = append(order, r)
			}
			samples[r][store] = append(samples[r][store], v)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	var compared, single []row
	for _, r := range order {
		if _, ok := samples[r][""]; ok {
			single = append(single, r)
		} else {
			compared = append(compared, r)
		}
	}
	var b strings.Builder
	if len(compared) > 0 {
		b.WriteString("| benchmark | metric | orch | etcd | orch vs etcd |\n|---|---|---:|---:|---|\n")
		for _, r := range compared {
			o, e := median(samples[r]["orch"]), median(samples[r]["etcd"])
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.bench, r.metric, num(o), num(e), compare(r.metric, o, e))
		}
	}
	if len(single) > 0 {
		if len(compared) > 0 {
			b.WriteString("\n")
		}
		b.WriteString("| benchmark | metric | value |\n|---|---|---:|\n")
		for _, r := range single {
			fmt.Fprintf(&b, "| %s | %s | %s |\n", r.bench, r.metric, num(median(samples[r][""])))
		}
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// splitStore removes the store=orch or store=etcd element from a
// benchmark name.
func splitStore(name string) (rest, store string) {
	var keep []string
	for _, part := range strings.Split(name, "/") {
		if s, ok := strings.CutPrefix(part, "store="); ok && (s == "orch" || s == "etcd") {
			store = s
			continue
		}
		keep = append(keep, part)
	}
	return strings.Join(keep, "/"), store
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}

func num(v float64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// compare says how many times better orch is: rates are better higher,
// everything else (latencies, times) lower.
func compare(metric string, orch, etcd float64) string {
	if orch == 0 || etcd == 0 {
		return "-"
	}
	ratio := etcd / orch
	if strings.HasSuffix(metric, "/s") {
		ratio = orch / etcd
	}
	if ratio >= 1 {
		return fmt.Sprintf("%.2fx better", ratio)
	}
	return fmt.Sprintf("%.2fx worse", 1/ratio)
}
