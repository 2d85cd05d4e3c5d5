// Package apibench measures the API server the way clients meet it: real
// HTTPS, client-go, a durable store on disk. Creates by 64 concurrent
// clients, LISTs of 10,000 pods, and 500 watchers each receiving every
// event. Run it with `make bench`; the targets are in README.md.
package apibench
