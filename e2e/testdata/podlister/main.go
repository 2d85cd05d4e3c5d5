// Command podlister is an in-cluster client-go program in a test pod: it
// takes the pod's credentials exactly as rest.InClusterConfig() finds
// them (KUBERNETES_SERVICE_HOST and _PORT, the projected token and CA)
// and lists the pods of its namespace once a second, printing the HTTP
// status, or why it has no credentials.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

func main() {
	for ; ; time.Sleep(time.Second) {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			fmt.Println("no credentials:", err)
			continue
		}
		client, err := rest.HTTPClientFor(cfg)
		if err != nil {
			fmt.Println("no client:", err)
			continue
		}
		ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		if err != nil {
			fmt.Println("no namespace:", err)
			continue
		}
		resp, err := client.Get(cfg.Host + "/api/v1/namespaces/" + strings.TrimSpace(string(ns)) + "/pods")
		if err != nil {
			fmt.Println("error", err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		_ = json.Unmarshal(body, &list)
		fmt.Println("status", resp.StatusCode, "pods", len(list.Items))
	}
}
