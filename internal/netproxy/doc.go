// Package netproxy makes Services reachable on a node: Service VIPs and
// NodePorts as nftables or iptables rules (kube-proxy's two modes), routes
// to other nodes' pod networks, and the cluster DNS.
package netproxy
