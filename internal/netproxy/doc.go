// Package netproxy makes Services reachable on a node: Service VIPs and
// NodePorts as iptables rules, routes to other nodes' pod networks, and the
// cluster DNS.
package netproxy
