// Command nettools stands in, in the conformance harness's locally built
// test images, for the network tools Kubernetes' real agnhost image (an
// Alpine one) carries and its busybox userland here lacks or cuts short:
// curl, nc (with -v, -t, -u, -z), dig and getent hosts. One static binary,
// called by any of those names, doing what the e2e specs ask of each (their
// flags and exit codes), no more. It is not part of orch.
package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "nettools" && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	var code int
	switch name {
	case "curl":
		code = curl(args)
	case "nc":
		code = nc(args)
	case "dig":
		code = dig(args)
	case "getent":
		code = getent(args)
	default:
		fmt.Fprintf(os.Stderr, "nettools: unknown tool %q (curl, nc, dig, getent)\n", name)
		code = 2
	}
	os.Exit(code)
}

// curl: curl [-q] [-s] [-g] [-k] [-I] [-L] [-o FILE] [-w FORMAT]
// [--connect-timeout S] [--max-time S] [-X METHOD] [-H HEADER] [-d DATA] URL.
// Exit codes as curl's: 7 no connection, 28 timeout, 6 no such host.
func curl(args []string) int {
	var url, out, format, method, data string
	var headers []string
	head, insecure, follow := false, false, false
	connect, total := 0*time.Second, 0*time.Second
	seconds := func(s string) time.Duration {
		f, _ := strconv.ParseFloat(s, 64)
		return time.Duration(f * float64(time.Second))
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func() string {
			i++
			if i < len(args) {
				return args[i]
			}
			return ""
		}
		switch a {
		case "-q", "-s", "-g", "--silent", "-S", "-f", "--fail":
		case "-k", "--insecure":
			insecure = true
		case "-I", "--head":
			head = true
		case "-L", "--location":
			follow = true
		case "-o", "--output":
			out = next()
		case "-w", "--write-out":
			format = next()
		case "--connect-timeout":
			connect = seconds(next())
		case "-m", "--max-time":
			total = seconds(next())
		case "-X", "--request":
			method = next()
		case "-H", "--header":
			headers = append(headers, next())
		case "-d", "--data":
			data = next()
		default:
			if strings.HasPrefix(a, "-") {
				continue // a flag the specs do not rely on
			}
			url = a
		}
	}
	if url == "" {
		fmt.Fprintln(os.Stderr, "curl: no URL specified")
		return 2
	}
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	switch {
	case method != "":
	case head:
		method = http.MethodHead
	case data != "":
		method = http.MethodPost
	default:
		method = http.MethodGet
	}
	dialer := &net.Dialer{Timeout: connect}
	client := &http.Client{Timeout: total, Transport: &http.Transport{DialContext: dialer.DialContext, Proxy: nil,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: insecure}}} //nolint:gosec // curl -k
	if !follow {
		client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	var body io.Reader
	if data != "" {
		body = strings.NewReader(data)
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		fmt.Fprintln(os.Stderr, "curl:", err)
		return 3
	}
	for _, h := range headers {
		if k, v, ok := strings.Cut(h, ":"); ok {
			req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		var dnsErr *net.DNSError
		var netErr net.Error
		switch {
		case errors.As(err, &dnsErr):
			return 6
		case errors.As(err, &netErr) && netErr.Timeout():
			return 28
		}
		return 7
	}
	defer func() { _ = resp.Body.Close() }()
	w := io.Writer(os.Stdout)
	if out != "" && out != "-" {
		f, err := os.Create(out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "curl:", err)
			return 23
		}
		defer func() { _ = f.Close() }()
		w = f
	}
	if head {
		fmt.Fprintf(w, "%s %s\r\n", resp.Proto, resp.Status)
		_ = resp.Header.Write(w)
		fmt.Fprint(w, "\r\n")
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return 56
	}
	if format != "" {
		fmt.Print(strings.ReplaceAll(strings.ReplaceAll(format, "%{http_code}", strconv.Itoa(resp.StatusCode)), `\n`, "\n"))
	}
	return 0
}

// nc: nc [-v] [-t|-u] [-z] [-w SECONDS] HOST PORT. Connects, sends what
// comes on stdin and prints what comes back until the peer closes or
// stays quiet for -w seconds (a UDP reply is read once).
func nc(args []string) int {
	verbose, udp, zero := false, false, false
	wait := 0 * time.Second
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-w" && i+1 < len(args):
			n, _ := strconv.Atoi(args[i+1])
			wait = time.Duration(n) * time.Second
			i++
		case strings.HasPrefix(a, "-w") && len(a) > 2:
			n, _ := strconv.Atoi(a[2:])
			wait = time.Duration(n) * time.Second
		case strings.HasPrefix(a, "-") && len(a) > 1:
			for _, f := range a[1:] {
				switch f {
				case 'v':
					verbose = true
				case 'u':
					udp = true
				case 'z':
					zero = true
				}
			}
		default:
			rest = append(rest, a)
		}
	}
	if len(rest) != 2 {
		fmt.Fprintln(os.Stderr, "usage: nc [-v] [-t|-u] [-z] [-w SECONDS] HOST PORT")
		return 1
	}
	network := "tcp"
	if udp {
		network = "udp"
	}
	address := net.JoinHostPort(rest[0], rest[1])
	timeout := wait
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	conn, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		if verbose {
			fmt.Fprintf(os.Stderr, "nc: connect to %s port %s (%s) failed: %v\n", rest[0], rest[1], network, err)
		}
		return 1
	}
	defer func() { _ = conn.Close() }()
	if verbose {
		fmt.Fprintf(os.Stderr, "Connection to %s %s port [%s/*] succeeded!\n", rest[0], rest[1], network)
	}
	if zero {
		return 0
	}
	in, _ := io.ReadAll(bufio.NewReader(os.Stdin))
	if len(in) > 0 {
		if _, err := conn.Write(in); err != nil {
			return 1
		}
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.CloseWrite()
	}
	buf := make([]byte, 64<<10)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		n, err := conn.Read(buf)
		if n > 0 {
			_, _ = os.Stdout.Write(buf[:n])
		}
		if err != nil || udp {
			var netErr net.Error
			if udp && err != nil && !(errors.As(err, &netErr) && netErr.Timeout()) {
				return 1
			}
			return 0
		}
	}
}

// dig: dig [+tcp|+notcp] [+noall] [+answer] [+search] [+short] NAME [TYPE].
// Prints the answer records (only their data with +short); the name is
// tried with resolv.conf's search domains as dig +search does.
func dig(args []string) int {
	tcp, short, search := false, false, false
	var name string
	qtype := dns.TypeA
	for _, a := range args {
		switch {
		case a == "+tcp":
			tcp = true
		case a == "+short":
			short = true
		case a == "+search":
			search = true
		case strings.HasPrefix(a, "+"), strings.HasPrefix(a, "-"):
		case name == "":
			name = a
		default:
			if t, ok := dns.StringToType[strings.ToUpper(a)]; ok {
				qtype = t
			}
		}
	}
	if name == "" {
		fmt.Fprintln(os.Stderr, "dig: no name given")
		return 1
	}
	conf, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil || len(conf.Servers) == 0 {
		fmt.Fprintln(os.Stderr, "dig: no nameserver in /etc/resolv.conf")
		return 9
	}
	names := []string{dns.Fqdn(name)}
	if search && !strings.HasSuffix(name, ".") {
		names = conf.NameList(name)
	}
	client := &dns.Client{Timeout: 5 * time.Second}
	if tcp {
		client.Net = "tcp"
	}
	server := net.JoinHostPort(conf.Servers[0], conf.Port)
	for _, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n, qtype)
		m.RecursionDesired = true
		r, _, err := client.Exchange(m, server)
		if err != nil {
			fmt.Fprintln(os.Stderr, "dig:", err)
			return 9
		}
		if len(r.Answer) == 0 {
			continue
		}
		for _, rr := range r.Answer {
			if short {
				fields := strings.SplitN(rr.String(), "\t", 5)
				fmt.Println(fields[len(fields)-1])
			} else {
				fmt.Println(rr.String())
			}
		}
		return 0
	}
	return 0
}

// getent: getent hosts NAME, from /etc/hosts then DNS (with the search
// list), as the C library resolves it.
func getent(args []string) int {
	if len(args) != 2 || args[0] != "hosts" {
		fmt.Fprintln(os.Stderr, "usage: getent hosts NAME")
		return 1
	}
	addrs, err := net.LookupHost(args[1])
	if err != nil || len(addrs) == 0 {
		return 2
	}
	for _, a := range addrs {
		fmt.Printf("%-15s %s\n", a, args[1])
	}
	return 0
}
