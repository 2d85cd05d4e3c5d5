// Command apiprobe is an in-cluster client of the API server in a test
// pod: it finds the server as client-go's in-cluster config does (the
// kubernetes Service's KUBERNETES_SERVICE_HOST and _PORT), checks its
// certificate against the cluster CA (CA_PEM) and the Service's address,
// and prints the HTTP status of GET /version, once a second.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(os.Getenv("CA_PEM"))) {
		fmt.Println("no CA_PEM")
		os.Exit(1)
	}
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	for {
		resp, err := client.Get("https://" + net.JoinHostPort(host, port) + "/version")
		if err != nil {
			fmt.Println("error", err)
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			fmt.Println("status", resp.StatusCode, "from", host)
		}
		time.Sleep(time.Second)
	}
}
