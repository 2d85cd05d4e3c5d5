// Command dnsprobe resolves names as a Go program in a pod does (Go's own
// resolver, reading the pod's resolv.conf: its nameserver, search path
// and ndots), for the end-to-end tests: `dnsprobe host NAME`, `dnsprobe
// srv SERVICE PROTO NAME`, `dnsprobe cname NAME` and `dnsprobe get URL`
// print what they find on one line, or "error ...". With DNSPROBE_SERVER
// (host:port) set, it asks that server instead of resolv.conf's.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Println("usage: dnsprobe host|srv|cname|get ARGS")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &net.Resolver{PreferGo: true}
	if server := os.Getenv("DNSPROBE_SERVER"); server != "" {
		r.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, server)
		}
	}
	var out string
	var err error
	switch os.Args[1] {
	case "host":
		var addrs []string
		addrs, err = r.LookupHost(ctx, os.Args[2])
		slices.Sort(addrs)
		out = strings.Join(addrs, " ")
	case "srv":
		var srvs []*net.SRV
		_, srvs, err = r.LookupSRV(ctx, os.Args[2], os.Args[3], os.Args[4])
		var lines []string
		for _, s := range srvs {
			lines = append(lines, fmt.Sprintf("%s:%d", s.Target, s.Port))
		}
		slices.Sort(lines)
		out = strings.Join(lines, " ")
	case "cname":
		out, err = r.LookupCNAME(ctx, os.Args[2])
	case "get":
		var resp *http.Response
		resp, err = (&http.Client{Timeout: 5 * time.Second}).Get(os.Args[2])
		if err == nil {
			var body []byte
			body, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			out = strings.TrimSpace(string(body))
		}
	}
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println(out)
}
